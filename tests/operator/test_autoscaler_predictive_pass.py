"""The predictive policy in the operator's pass (`autoscaling.policy: predictive`): what `plan_pass` writes."""

from __future__ import annotations

import json
import math

import pytest

from kubeinfer.operator.autoscaling.policy_types import Signals
from kubeinfer.operator.autoscaling.predictive import StaffedSizing
from kubeinfer.operator.autoscaling.predictive_pass import NO_THROUGHPUT, PREDICTIVE_HOLD, PREDICTIVE_UP
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
