"""The predictive policy in the operator's pass (`autoscaling.policy: predictive`): what `plan_pass` writes."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from kubeinfer.operator.autoscaling.policies.predictive import StaffedSizing
from kubeinfer.operator.autoscaling.policies.predictive_pass import NO_THROUGHPUT, PREDICTIVE_HOLD, PREDICTIVE_UP
from kubeinfer.operator.autoscaling.signals.measured import Signals
from support.autoscale_objects import NOW, body, plan, pod, settled_status


@pytest.mark.parametrize("headroom", [0.0, 0.4, 1.0])
def test_staffed_sizing_is_the_reactive_square_root_rule_and_capacity_its_inverse(headroom):
    sizing = StaffedSizing(2.0, headroom)
    for rate in (0.0, 0.5, 3.0, 9.9, 40.0):
        offered = rate / 2.0
        assert sizing.replicas_for(rate) == max(1, math.ceil(offered + headroom * math.sqrt(offered) - 1e-9))
    for n in range(1, 30):
        assert sizing.replicas_for(sizing.capacity(n)) == n   # the most a fleet of n serves
        assert sizing.replicas_for(sizing.capacity(n) * 1.001 + 1e-6) == n + 1


def predictive_body(status, **autoscaling):
    return body(replicas=2, status=status, policy="predictive", **autoscaling)


def test_without_a_throughput_the_reactive_policy_decides_and_says_why():
    b = predictive_body(settled_status(2))
    p = plan(b, Signals(NOW, queue_depth=20, num_running=8, ttft_p95_seconds=0.3), [pod("a"), pod("b")])
    reactive = plan(body(replicas=2, status=settled_status(2)),
                    Signals(NOW, queue_depth=20, num_running=8, ttft_p95_seconds=0.3), [pod("a"), pod("b")])
    assert p.decision.desired_replicas == reactive.decision.desired_replicas == 5
    assert p.decision.reason == "ScaleUp" and p.decision.message.startswith(NO_THROUGHPUT)
    waits = "0 of 500 engine steps, 0 of 200 finished requests"   # no usage in these signals
    assert p.status["predictive"]["calibrationWaitsFor"] == waits and f"it waits for {waits})" in p.decision.message
    assert p.status["predictive"]["state"]["forecast"]["updated_at"] is None   # nothing forecast yet


def test_orders_the_forecast_fleet_and_writes_its_state_and_reasons():
    b = predictive_body(settled_status(2), throughputPerReplica=2)
    signals = Signals(NOW, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=10.0)
    p = plan(b, signals, [pod("a"), pod("b")])
    # 10 req/s at 2 a replica, minus a Poisson count's own noise over the 60 s window, with the reactive
    # policy's square-root headroom: 4.8 + 0.4 sqrt(4.8) -> 6.
    assert (p.decision.desired_replicas, p.replicas, p.decision.reason) == (6, 6, PREDICTIVE_UP)
    assert [(e.reason, e.message.split(":")[0]) for e in p.events] == [(PREDICTIVE_UP, "2 -> 6 replicas")]
    forecast = p.status["predictive"]["forecast"]
    assert forecast["arrivalRate"] == forecast["rate"] == 10.0 and forecast["ratePerReplica"] == 2.0
    assert forecast["horizonSeconds"] == 60.0 and forecast["reason"] == p.decision.message
    assert p.status["scalingHistory"]["events"][-1]["reason"] == PREDICTIVE_UP   # one event, the predictive one
    assert len(p.status["scalingHistory"]["events"]) == 1


def test_a_restarted_operator_resumes_the_forecast_from_status():
    """Two passes whose state crossed the API server (JSON) decide as two passes of one process."""
    def pass_at(status, t, rate, replicas):
        b = predictive_body(status, throughputPerReplica=2)
        b["spec"]["replicas"] = replicas
        from kubeinfer.operator.autoscaling import autoscaler
        from kubeinfer.operator.spec import parse_spec
        return autoscaler.plan_pass(b, parse_spec(b["spec"]), Signals(t, queue_depth=0, num_running=4,
                                    ttft_p95_seconds=0.2, request_rate=rate), [pod("a"), pod("b")], t)

    first = pass_at(settled_status(2), NOW, 4.0, 2)
    stored = json.loads(json.dumps(first.status))
    second = pass_at(stored, NOW + 15, 9.0, first.decision.desired_replicas)
    state = second.status["predictive"]["state"]["forecast"]
    assert state["updated_at"] == NOW + 15 and 4.0 < state["level"] < 9.0 and state["trend"] > 0
    fresh = pass_at(settled_status(2), NOW + 15, 9.0, first.decision.desired_replicas)
    assert fresh.status["predictive"]["state"]["forecast"]["level"] == 9.0   # a lost state starts over


def test_missing_metrics_hold_and_keep_the_stored_forecast():
    first = plan(predictive_body(settled_status(2), throughputPerReplica=2),   # 3 req/s: 2 replicas hold it
                 Signals(NOW, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=3.0),
                 [pod("a"), pod("b")])
    assert first.decision.reason == PREDICTIVE_HOLD
    stored = json.loads(json.dumps(first.status))
    blind = plan(predictive_body(stored, throughputPerReplica=2), Signals.missing("no pod answered", NOW + 15),
                 [pod("a"), pod("b")])
    assert (blind.decision.desired_replicas, blind.decision.reason) == (2, "MetricsUnavailable")
    assert blind.status["predictive"] == stored["predictive"]


def calibrated_usage(seed: int = 0, prompts: tuple[float, float] = (1920.0, 2048.0),
                     outputs: tuple[float, float] = (24.0, 32.0)):
    """A 60 s window of two replicas' steps, timed by the simulator's replica model, and their requests' lengths
    (prompts of 2,000 tokens, outputs of 30: the buckets given): what the runtime's calibration series would show."""
    from kubeinfer.operator.autoscaling.sizing.calibration import ReplicaUsage, StepMoments
    import random
    rng = random.Random(seed)
    m = [0.0] * 9
    for _ in range(2000):
        n, p = rng.randint(0, 20), rng.choice((0, 0, 2000, 4000))
        t = 0.02 + 0.0008 * n + 0.00012 * p
        for k, v in enumerate((1, t, n, p, n * n, n * p, p * p, n * t, p * t)):
            m[k] += v
    inf = float("inf")
    return ReplicaUsage(StepMoments(*m), ((prompts[0], 0.0), (prompts[1], 300.0), (inf, 300.0)),
                        ((outputs[0], 0.0), (outputs[1], 300.0), (inf, 300.0)))


def test_with_a_calibrated_replica_model_the_pass_sizes_by_it_not_by_the_throughput():
    """2 req/s of 2,000-token prompts: 2 req/s is half of what a replica prefills at saturation (so square-root
    staffing over 4 req/s asks for 1 replica), but 0.25 s of prefill each keeps TTFTs within 0.5 s only on a
    fleet with room to spare: the calibrated model's sizing asks for more."""
    signals = Signals(NOW, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=2.0,
                      usage=calibrated_usage())
    staffed = plan(predictive_body(settled_status(1), throughputPerReplica=4), replace(signals, usage=None),
                   [pod("a")])
    assert staffed.status["predictive"]["replicaModel"] is None
    assert staffed.decision.desired_replicas == 1 and staffed.status["predictive"]["forecast"]["ratePerReplica"] == 4
    p = plan(predictive_body(settled_status(1), throughputPerReplica=4, targetTTFTP95Seconds=0.5), signals, [pod("a")])
    model = p.status["predictive"]["replicaModel"]
    assert (model["decodeBaseSeconds"], model["decodePerSequenceSeconds"], model["prefillSecondsPerToken"]) == \
        (0.02, 0.0008, 0.00012)
    assert all(1920 < p <= 2048 for p in model["prompts"]) and set(model["outputs"]) <= set(range(24, 33))
    assert model["attainableShare"] == 1.0   # 2,048 tokens: 0.27 s on an idle replica
    forecast = p.status["predictive"]["forecast"]
    assert forecast["sizing"] == "calibrated replica model, 98.0% within target" and "ratePerReplica" not in forecast
    assert p.decision.reason == PREDICTIVE_UP and p.decision.desired_replicas == forecast["replicasNeeded"] >= 3
    # the next pass (its status through JSON) keeps the model and its sizing; no throughput is needed with it
    stored = json.loads(json.dumps(p.status))
    b = predictive_body(stored, targetTTFTP95Seconds=0.5)
    b["spec"]["replicas"] = p.decision.desired_replicas
    from kubeinfer.operator.autoscaling import autoscaler
    from kubeinfer.operator.spec import parse_spec
    again = autoscaler.plan_pass(b, parse_spec(b["spec"]), replace(signals, timestamp=NOW + 5),
                                 [pod("a"), pod("b"), pod("c")], NOW + 5)
    assert again.status["predictive"]["replicaModel"] == model
    assert again.decision.reason == PREDICTIVE_HOLD


def test_an_itl_target_sizes_the_fleet_for_it_and_one_no_fleet_meets_is_said():
    """Chat-like requests (prompts of ~480 tokens, outputs of ~240) at 8 req/s: each prompt is prefilled in a step
    of ~0.08 s that the replica's decoding sequences wait, so a 0.05 s ITL target asks for a fleet with fewer
    sequences and admissions per replica than the TTFT target alone; a target below a step of one sequence
    (0.0208 s) no fleet meets, and the status says so."""
    signals = Signals(NOW, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=8.0,
                      usage=calibrated_usage(prompts=(384.0, 512.0), outputs=(192.0, 256.0)))
    plain = plan(predictive_body(settled_status(1), targetTTFTP95Seconds=0.5), signals, [pod("a")])
    itl = plan(predictive_body(settled_status(1), targetTTFTP95Seconds=0.5, targetITLP95Seconds=0.05), signals,
               [pod("a")])
    sized = itl.status["predictive"]["forecast"]
    assert sized["sizing"].endswith("within target, 95% of tokens within the ITL target 0.05 s")
    assert sized["replicasNeeded"] > plain.status["predictive"]["forecast"]["replicasNeeded"] + 1
    low = plan(predictive_body(settled_status(1), targetTTFTP95Seconds=0.5, targetITLP95Seconds=0.02), signals,
               [pod("a")])
    said = low.status["predictive"]["forecast"]
    assert said["sizing"].endswith("the ITL target 0.02 s is below a step of one sequence (0.0208 s on the calibrated "
                                   "model): no fleet holds it, sized on the TTFT target alone")
    assert said["replicasNeeded"] == plain.status["predictive"]["forecast"]["replicasNeeded"]


def test_a_significant_recent_rise_orders_for_the_recent_rate_and_a_fall_waits_for_the_window():
    """Settled at 3 req/s (2 replicas of 2 req/s), the last seconds show 12 req/s: far beyond a Poisson count's
    noise, so the pass sizes for 12 at once. The same seconds at 0 req/s are no reason to release anything."""
    def pass_with(recent_rate):
        first = plan(predictive_body(settled_status(2), throughputPerReplica=2),
                     Signals(NOW, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=3.0),
                     [pod("a"), pod("b")])
        b = predictive_body(json.loads(json.dumps(first.status)), throughputPerReplica=2)
        from kubeinfer.operator.autoscaling import autoscaler
        from kubeinfer.operator.spec import parse_spec
        signals = Signals(NOW + 5, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=3.0,
                          recent_request_rate=recent_rate)
        return autoscaler.plan_pass(b, parse_spec(b["spec"]), signals, [pod("a"), pod("b")], NOW + 5)

    window_only = pass_with(None)
    assert window_only.decision.reason == PREDICTIVE_HOLD
    assert window_only.status["predictive"]["forecast"]["arrivalRateFrom"] == "window"
    rise = pass_with(12.0)
    forecast = rise.status["predictive"]["forecast"]
    assert (forecast["arrivalRateFrom"], forecast["arrivalRate"], forecast["rate"]) == ("recent", 12.0, 12.0)
    assert rise.decision.reason == PREDICTIVE_UP and rise.decision.desired_replicas >= 7   # 6 + 0.4 sqrt(6)
    fall = pass_with(0.0)
    assert fall.decision.reason == PREDICTIVE_HOLD
    assert fall.status["predictive"]["forecast"]["arrivalRateFrom"] == "window"
