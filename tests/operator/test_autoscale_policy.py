"""Unit tests of the autoscaling policy: one or more per rule stated above `decide()`."""

from __future__ import annotations

import json
from dataclasses import replace

import pydantic
import pytest

from kubeinfer.operator.autoscaling.policies import reactive as ap
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals

T0 = 1_000_000.0


def cfg(**kw) -> PolicyConfig:
    base = dict(max_replicas=10, min_replicas=1)
    return PolicyConfig(**{**base, **kw})


def sig(now: float, queue: float = 0.0, running: float = 0.0, ttft: float | None = None,
        rate: float | None = None) -> Signals:
    return Signals(timestamp=now, queue_depth=queue, num_running=running, ttft_p95_seconds=ttft,
                   request_rate=rate)


def settled(ready: int, since: float = T0 - 3600) -> ScaleHistory:
    """A history that has been running for an hour with `ready` replicas and recent traffic."""
    return ScaleHistory(started_at=since, last_ready=ready, ready_changed_at=since, last_traffic_time=T0)


# ---- config -------------------------------------------------------------------------------------

def test_config_from_camel_case_dict_applies_contract_defaults():
    c = PolicyConfig.from_spec({"maxReplicas": 8, "minReplicas": 0, "targetTTFTP95Seconds": 0.25,
                                "someFutureField": 1, "throughputPerReplica": 3.5})
    assert c.assumed_throughput_per_replica == 3.5
    assert (c.max_replicas, c.min_replicas, c.target_ttft_p95_seconds) == (8, 0, 0.25)
    assert (c.target_queue_depth_per_replica, c.metric_window_seconds, c.scale_down_stabilization_seconds,
            c.max_scale_up_step, c.max_scale_down_step, c.scale_to_zero_idle_seconds,
            c.initial_delay_seconds, c.tolerance, c.scale_up_stabilization_seconds) == \
        (4, 60, 300, 4, 1, 600, 120, 0.1, 0)


def test_config_from_pydantic_model_with_aliases():
    class Autoscaling(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(populate_by_name=True)
        max_replicas: int = pydantic.Field(alias="maxReplicas")
        target_queue_depth_per_replica: float = pydantic.Field(4, alias="targetQueueDepthPerReplica")

    c = PolicyConfig.from_spec(Autoscaling(maxReplicas=5, targetQueueDepthPerReplica=2.5), stale_after_seconds=30)
    assert (c.max_replicas, c.target_queue_depth_per_replica, c.stale_after_seconds) == (5, 2.5, 30)


def test_config_refuses_missing_max_and_inverted_bounds():
    with pytest.raises(ValueError):
        PolicyConfig.from_spec({"minReplicas": 1})
    with pytest.raises(AssertionError):
        PolicyConfig.from_spec({"minReplicas": 5, "maxReplicas": 2})


# ---- scale-up ------------------------------------------------------------------------------------

def test_queue_above_target_scales_up_several_at_once():
    # 2 replicas saturated at 32 running each, 100 waiting: (64+100)/(32+4) = 4.6 -> 5 replicas.
    d = ap.decide(sig(T0, queue=100, running=64), ReplicaCounts(2, 2), settled(2), cfg(), T0)
    assert (d.desired_replicas, d.reason) == (5, ap.SCALE_UP)
    assert d.history.capacity_per_replica == 32


def test_scale_up_bounded_by_step_and_max():
    d = ap.decide(sig(T0, queue=2000, running=64), ReplicaCounts(2, 2), settled(2), cfg(), T0)
    assert d.desired_replicas == 2 + 4
    d = ap.decide(sig(T0, queue=2000, running=64), ReplicaCounts(2, 2), settled(2), cfg(max_replicas=3), T0)
    assert d.desired_replicas == 3


def test_ttft_above_target_scales_up_even_with_short_queue():
    # Queue under target (2 waiting on 3 replicas), TTFT P95 3x the target: ready x min(3, 2) = 6.
    d = ap.decide(sig(T0, queue=2, running=30, ttft=1.5), ReplicaCounts(3, 3), settled(3), cfg(), T0)
    assert (d.desired_replicas, d.reason) == (6, ap.SCALE_UP)
    assert "TTFT" in d.message


def test_ttft_does_not_add_while_replicas_load_or_fleet_just_changed():
    # Replicas pending: the windowed P95 still describes the smaller fleet, so no more from TTFT.
    d = ap.decide(sig(T0, queue=0, running=30, ttft=1.5), ReplicaCounts(5, 3, pending=2), settled(3), cfg(), T0)
    assert d.desired_replicas == 5 and d.recommendation <= 5 and d.reason != ap.SCALE_UP
    # Just became ready 10 s ago (window 60 s): wait.
    hist = ScaleHistory(started_at=T0 - 3600, last_ready=5, ready_changed_at=T0 - 10, last_traffic_time=T0)
    d = ap.decide(sig(T0, queue=0, running=30, ttft=1.5), ReplicaCounts(5, 5), hist, cfg(), T0)
    assert d.desired_replicas == 5
    # ... but the queue, an instant signal, still adds replicas while others load.
    d = ap.decide(sig(T0, queue=200, running=96), ReplicaCounts(5, 3, pending=2), settled(3), cfg(), T0)
    assert d.desired_replicas == 9


def test_scale_up_stabilization_needs_the_signal_to_hold():
    c = cfg(scale_up_stabilization_seconds=30)
    hist, current = settled(2), 2
    high = dict(queue=100, running=64)
    decisions = []
    for i in range(4):
        now = T0 + 15 * i
        s = sig(now, **high) if i > 0 else sig(now, queue=8, running=64)  # t=0: on target
        d = ap.decide(s, ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
        decisions.append((d.desired_replicas, d.reason))
    # t=0 on target, t=15 high (window still holds the low one), t=30 high (still), t=45: both in window high.
    assert decisions[1] == (2, ap.STABILIZING_UP) and decisions[2] == (2, ap.STABILIZING_UP)
    assert decisions[3][1] == ap.SCALE_UP and decisions[3][0] > 2


# ---- tolerance and flapping ---------------------------------------------------------------------

def test_signals_inside_tolerance_band_change_nothing():
    c, hist, current = cfg(), settled(4), 4
    for i in range(40):  # 10 minutes of queue 3.7..4.3 per replica and TTFT 0.46..0.54 s
        now = T0 + 15 * i
        q = 15.0 if i % 2 else 17.0  # 3.75 or 4.25 per replica
        t = 0.46 if i % 2 else 0.54
        d = ap.decide(sig(now, queue=q, running=128, ttft=t), ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
        assert d.reason == ap.WITHIN_TOLERANCE
    assert current == 4 and hist.events == ()


def test_flapping_load_scales_up_once_and_does_not_scale_down_inside_window():
    c, hist, current = cfg(), settled(3), 3
    sizes = []
    for i in range(20):  # 5 minutes alternating heavy queue / empty queue every 15 s
        now = T0 + 15 * i
        s = sig(now, queue=60, running=96) if i % 2 == 0 else sig(now, queue=0, running=20, ttft=0.1)
        d = ap.decide(s, ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
        sizes.append(current)
    assert sizes == sorted(sizes), f"never goes down while the window holds a high recommendation: {sizes}"
    assert sizes[0] > 3
    assert all(e.reason == ap.SCALE_UP for e in hist.events), "no down/up churn"


def test_scale_down_waits_for_the_window_then_steps_by_one():
    c, current = cfg(), 6
    # a steady recommendation of 6, last made 200 s ago
    hist = replace(settled(6), recommendations=((T0 - 200, 6, 0),), recommended_until=T0 - 200)
    downs = []
    for i in range(30):  # 7.5 minutes of light load: 12 running over 6 replicas, no queue, fast TTFT
        now = T0 + 15 * i
        d = ap.decide(sig(now, queue=0, running=12, ttft=0.1), ReplicaCounts(current, current), hist, c, now)
        if d.desired_replicas < current:
            downs.append((now - T0, current - d.desired_replicas))
        hist, current = d.history, d.desired_replicas
    assert downs and all(step == 1 for _, step in downs)
    # the recommendation of 6 leaves the 300 s window at t=100: the first step down is the next tick
    assert downs[0][0] == 105
    assert [t for t, _ in downs[:3]] == [105, 120, 135]


def test_fresh_history_never_scales_down_before_a_full_window():
    c, hist, current = cfg(), ScaleHistory(), 6
    for i in range(19):  # 4.5 minutes
        now = T0 + 15 * i
        d = ap.decide(sig(now, queue=0, running=6, ttft=0.1), ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
        assert current == 6 and d.reason == ap.STABILIZING_DOWN
    now = T0 + 301
    d = ap.decide(sig(now, queue=0, running=6, ttft=0.1), ReplicaCounts(6, 6), hist, c, now)
    assert (d.desired_replicas, d.reason) == (5, ap.SCALE_DOWN)


def test_no_scale_down_while_replicas_pending():
    d = ap.decide(sig(T0, queue=0, running=2, ttft=0.1), ReplicaCounts(6, 4, pending=2), settled(4), cfg(), T0)
    assert (d.desired_replicas, d.reason) == (6, ap.PENDING_REPLICAS)
    d = ap.decide(sig(T0, queue=0, running=2, ttft=0.1), ReplicaCounts(6, 6), settled(6), cfg(), T0)
    assert d.desired_replicas == 5


def test_throughput_sizes_the_fleet_by_square_root_staffing():
    # 4 req/s per replica at saturation; 8 req/s arriving (no queue, steady over the window):
    # load 2 replicas, 2 + 0.4 * sqrt(2) = 2.57 -> 3 recommended, one step down per decision.
    hist = replace(settled(8), throughput_per_replica=4.0)
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=8.0), ReplicaCounts(8, 8), hist, cfg(), T0)
    assert d.recommendation == 3 and (d.desired_replicas, d.reason) == (7, ap.SCALE_DOWN)
    assert "8.00 req/s" in d.message
    # The same sizing scales up ahead of any queue: 12 req/s on 2 replicas -> 3 + 0.4 * sqrt(3) = 3.7 -> 4.
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=12.0), ReplicaCounts(2, 2),
                  replace(settled(2), throughput_per_replica=4.0), cfg(), T0)
    assert (d.desired_replicas, d.reason) == (4, ap.SCALE_UP)
    # A need within the tolerance below the ready count keeps it (no churn at the edge).
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=10.5), ReplicaCounts(4, 4),
                  replace(settled(4), throughput_per_replica=4.0), cfg(), T0)
    assert d.recommendation == 4  # load 2.625: 2.625 + 0.4 * 1.62 = 3.27 -> 4
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=13.0), ReplicaCounts(4, 4),
                  replace(settled(4), throughput_per_replica=4.0), cfg(), T0)
    assert d.recommendation == 4  # load 3.25: 3.25 + 0.72 = 3.97, inside the band below 4


def test_arrival_rate_counts_the_queue_change_over_the_window():
    # Served 6 req/s while the queue emptied from 120 to 0 over 60 s: 4 req/s arrive.
    samples = ((T0 - 60, 120.0, 64.0, 4), (T0 - 30, 60.0, 64.0, 4))
    hist = replace(settled(4), throughput_per_replica=4.0, queue_samples=samples)
    d = ap.decide(sig(T0, queue=0, running=20, ttft=0.2, rate=6.0), ReplicaCounts(4, 4), hist, cfg(), T0)
    assert "4.00 req/s" in d.message and d.recommendation == 2  # 1 + 0.4 = 1.4 -> 2


def test_spec_throughput_is_used_until_one_is_measured():
    c = cfg(assumed_throughput_per_replica=2.0)
    d = ap.decide(sig(T0, queue=0, running=10, ttft=0.2, rate=8.0), ReplicaCounts(3, 3), settled(3), c, T0)
    assert d.recommendation == 5  # load 4 replicas: 4 + 0.4 * 2 = 4.8 -> 5
    measured = replace(settled(3), throughput_per_replica=8.0)
    d = ap.decide(sig(T0, queue=0, running=10, ttft=0.2, rate=8.0), ReplicaCounts(3, 3), measured, c, T0)
    assert d.recommendation == 2  # 1 + 0.4 = 1.4 -> 2: a higher measurement raises the spec value


def test_throughput_is_learned_from_a_busy_window_with_a_steady_fleet():
    c, current = cfg(metric_window_seconds=60), 2
    hist = settled(2)
    for i in range(7):  # 60 s of a queue above target on 2 replicas, serving 7 req/s in all
        now = T0 + 10 * i
        d = ap.decide(sig(now, queue=10, running=64, rate=7.0), ReplicaCounts(current, current), hist, c, now)
        hist = replace(d.history, events=())
    assert hist.throughput_per_replica == pytest.approx(3.5)
    assert hist.capacity_per_replica == 32
    # A fleet whose ready count changed inside the window measures nothing (new replicas fill at once).
    hist = settled(2)
    for i in range(7):
        now = T0 + 10 * i
        ready = 2 if i < 4 else 3
        d = ap.decide(sig(now, queue=12, running=32 * ready, rate=7.0), ReplicaCounts(3, ready, 3 - ready),
                      hist, c, now)
        hist = d.history
    assert hist.throughput_per_replica is None
    # An idle window measures nothing either.
    hist = settled(2)
    for i in range(7):
        now = T0 + 10 * i
        hist = ap.decide(sig(now, queue=0, running=4, rate=1.0), ReplicaCounts(2, 2), hist, c, now).history
    assert hist.throughput_per_replica is None


def test_a_growing_queue_is_projected_over_the_loading_time():
    c = cfg(initial_delay_seconds=60, max_replicas=40)
    hist = replace(settled(2), queue_samples=((T0 - 10, 20.0, 64.0, 2),))
    # The queue grew by 40 in 10 s: 4/s for 60 s more: (64 + 60 + 240) / (32 + 4) = 10.1 -> 11.
    d = ap.decide(sig(T0, queue=60, running=64), ReplicaCounts(2, 2), hist, c, T0)
    assert d.recommendation == 11 and "growing 4.0/s" in d.message
    # Scale-up adds the larger of maxScaleUpStep and the current count (doubling) per decision.
    assert d.desired_replicas == 2 + 4
    # 6 ready running 32 each: (192 + 60 + 240) / 36 = 13.7 -> 14, at most 6 + 6 = 12 this decision.
    d = ap.decide(sig(T0, queue=60, running=192), ReplicaCounts(6, 6), replace(hist, last_ready=6), c, T0)
    assert (d.recommendation, d.desired_replicas) == (14, 12)


def test_a_learned_cold_start_replaces_initial_delay_seconds_in_the_projection():
    hist = replace(settled(2), queue_samples=((T0 - 10, 20.0, 64.0, 2),))
    guessed = cfg(initial_delay_seconds=60, max_replicas=40)
    learned = replace(guessed, learned_cold_start_seconds=15.0)
    assert (guessed.cold_start_seconds, learned.cold_start_seconds) == (60.0, 15.0)
    # 4/s for 15 s, not 60: (64 + 60 + 60) / (32 + 4) = 5.1 -> 6 (the guess gives 11, as above).
    d = ap.decide(sig(T0, queue=60, running=64), ReplicaCounts(2, 2), hist, learned, T0)
    assert d.recommendation == 6 and "over a 15s cold start" in d.message
    # A learned cold start of 0 is a measurement, not a missing value.
    d = ap.decide(sig(T0, queue=60, running=64), ReplicaCounts(2, 2), hist,
                  replace(guessed, learned_cold_start_seconds=0.0), T0)
    assert d.recommendation == 4  # (64 + 60) / 36 = 3.4 -> 4


def test_overload_recommendation_holds_scale_down_for_one_metric_window_only():
    c = cfg(metric_window_seconds=60, scale_down_stabilization_seconds=300)
    hist = replace(settled(10), throughput_per_replica=4.0,
                   recommendations=((T0 - 200, 10, 1), (T0 - 200, 3, 0)), recommended_until=T0 - 200)
    # The overload recommendation of 10 is 200 s old: no longer in force, though inside the 300 s window.
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=8.0), ReplicaCounts(10, 10), hist, c, T0)
    assert (d.desired_replicas, d.reason) == (9, ap.SCALE_DOWN)
    # A steady one of the same age still holds.
    hist = replace(hist, recommendations=((T0 - 200, 10, 0),))
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=8.0), ReplicaCounts(10, 10), hist, c, T0)
    assert (d.desired_replicas, d.reason) == (10, ap.STABILIZING_DOWN)
    # An overload one 30 s old holds too.
    hist = replace(hist, recommendations=((T0 - 30, 10, 1),), recommended_until=T0 - 30)
    d = ap.decide(sig(T0, queue=0, running=40, ttft=0.2, rate=8.0), ReplicaCounts(10, 10), hist, c, T0)
    assert (d.desired_replicas, d.reason) == (10, ap.STABILIZING_DOWN)


def test_ttft_of_a_drained_backlog_adds_nothing():
    # The fleet has been ready for a whole window, but the queue was above target in it: the windowed P95
    # describes the backlog that is now gone, so it has no say; the queue (empty) rules.
    samples = ((T0 - 50, 200.0, 96.0, 3), (T0 - 40, 0.0, 30.0, 3))
    hist = replace(settled(3), queue_samples=samples)
    d = ap.decide(sig(T0, queue=0, running=30, ttft=5.0), ReplicaCounts(3, 3), hist, cfg(), T0)
    assert d.desired_replicas <= 3 and "TTFT" in d.message
    hist = replace(hist, queue_samples=())
    d = ap.decide(sig(T0, queue=0, running=30, ttft=5.0), ReplicaCounts(3, 3), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason) == (6, ap.SCALE_UP)


# ---- missing and stale metrics ------------------------------------------------------------------

def test_missing_metrics_hold_and_never_scale_down():
    for current in (1, 5):
        d = ap.decide(Signals.missing("connection refused", T0), ReplicaCounts(current, current),
                      settled(current), cfg(min_replicas=0), T0)
        assert (d.desired_replicas, d.reason) == (current, ap.METRICS_UNAVAILABLE)
        assert "connection refused" in d.message


def test_stale_metrics_hold():
    d = ap.decide(sig(T0 - 600, queue=0, running=0), ReplicaCounts(5, 5), settled(5), cfg(min_replicas=0), T0)
    assert (d.desired_replicas, d.reason) == (5, ap.METRICS_STALE)


def test_missing_metrics_never_lead_to_zero():
    c, hist, current = cfg(min_replicas=0, scale_to_zero_idle_seconds=600), settled(1), 1
    hist = ScaleHistory(started_at=T0 - 7200, last_ready=1, ready_changed_at=T0 - 7200,
                        last_traffic_time=T0 - 7200)
    for i in range(60):  # 15 minutes of outage
        now = T0 + 15 * i
        d = ap.decide(Signals.missing("timeout", now), ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
    assert current == 1
    # Metrics come back showing no traffic: the idle clock restarted at the outage, so not at once.
    now = T0 + 15 * 60
    d = ap.decide(sig(now), ReplicaCounts(1, 1), hist, c, now)
    assert d.desired_replicas == 1


# ---- zero ---------------------------------------------------------------------------------------

def test_scale_to_zero_only_after_idle_period():
    c = cfg(min_replicas=0, scale_to_zero_idle_seconds=600)
    hist = ScaleHistory(started_at=T0 - 7200, last_ready=1, ready_changed_at=T0 - 7200, last_traffic_time=T0)
    current, zero_at = 1, None
    for i in range(50):
        now = T0 + 15 * i
        d = ap.decide(sig(now, rate=0.0), ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
        if current == 0:
            zero_at = now - T0
            assert d.reason == ap.SCALE_TO_ZERO
            break
    assert zero_at is not None and 600 <= zero_at < 615


def test_never_below_min_replicas_without_traffic():
    c, hist, current = cfg(min_replicas=2), settled(3), 3
    for i in range(100):
        now = T0 + 15 * i
        d = ap.decide(sig(now), ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
    assert current == 2


def test_traffic_resets_idle_clock_and_keeps_one_replica():
    c = cfg(min_replicas=0, scale_to_zero_idle_seconds=600)
    hist = ScaleHistory(started_at=T0 - 7200, last_ready=1, ready_changed_at=T0 - 7200, last_traffic_time=T0 - 590)
    d = ap.decide(sig(T0, running=1), ReplicaCounts(1, 1), hist, c, T0)
    assert d.desired_replicas == 1 and d.history.last_traffic_time == T0
    d = ap.decide(sig(T0 + 15), ReplicaCounts(1, 1), d.history, c, T0 + 15)
    assert d.desired_replicas == 1


def test_scale_from_zero_on_waiting_requests_and_stay_at_zero_without():
    c = cfg(min_replicas=0)
    d = ap.decide(sig(T0), ReplicaCounts(0, 0), ScaleHistory(), c, T0)
    assert d.desired_replicas == 0
    d = ap.decide(sig(T0, queue=3), ReplicaCounts(0, 0), d.history, c, T0 + 15)
    assert (d.desired_replicas, d.reason) == (1, ap.SCALE_FROM_ZERO)
    # A crowd at zero: waiting / target, bounded by the step.
    d = ap.decide(sig(T0, queue=100), ReplicaCounts(0, 0), ScaleHistory(), c, T0)
    assert d.desired_replicas == 4
    # Missing metrics at zero stay at zero.
    d = ap.decide(Signals.missing("no pods", T0), ReplicaCounts(0, 0), ScaleHistory(), c, T0)
    assert d.desired_replicas == 0


# ---- bounds -------------------------------------------------------------------------------------

def test_bounds_apply_whatever_the_metrics():
    d = ap.decide(sig(T0, queue=500, running=500), ReplicaCounts(15, 15), settled(15), cfg(), T0)
    assert (d.desired_replicas, d.reason) == (10, ap.ABOVE_MAX)
    d = ap.decide(Signals.missing("x", T0), ReplicaCounts(15, 15), settled(15), cfg(), T0)
    assert d.desired_replicas == 10
    d = ap.decide(sig(T0), ReplicaCounts(1, 1), settled(1), cfg(min_replicas=3), T0)
    assert (d.desired_replicas, d.reason) == (3, ap.BELOW_MIN)


# ---- history round trip -------------------------------------------------------------------------

def _drive(c, signals, start_hist, start_current, t_start):
    hist, current, out = start_hist, start_current, []
    for i, s in enumerate(signals):
        now = t_start + 15 * i
        d = ap.decide(s(now), ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
        out.append((current, d.reason))
    return hist, current, out


def test_history_round_trips_through_json_and_restart_resumes_identically():
    c = cfg()
    load = [lambda n: sig(n, queue=80, running=64)] * 3 + [lambda n: sig(n, running=20, ttft=0.1)] * 30
    hist, current, first = _drive(c, load[:10], ScaleHistory(), 2, T0)
    assert hist.events, "the first part scaled up"
    restored = ScaleHistory.from_dict(json.loads(json.dumps(hist.to_dict())))
    # everything but the newest recommendation run's last pass, which moves at every pass and is not kept
    assert restored == replace(hist, recommended_until=None) and hist.recommended_until == T0 + 135
    # Uninterrupted run vs a "restarted operator" that reloaded the history from status.
    _, _, straight = _drive(c, load[10:], hist, current, T0 + 150)
    _, _, resumed = _drive(c, load[10:], restored, current, T0 + 150)
    assert straight == resumed
    # Losing the history instead would hold the size until a full window has passed.
    _, _, fresh = _drive(c, load[10:], ScaleHistory(), current, T0 + 150)
    assert all(n == current for n, _ in fresh[:19])


def test_history_from_partial_or_empty_dict():
    assert ScaleHistory.from_dict(None) == ScaleHistory()
    h = ScaleHistory.from_dict({"lastTrafficTime": 5.0, "recommendations": [[1.0, 3]]})
    assert h.last_traffic_time == 5.0 and h.recommendations == ((1.0, 3, 0),)


def test_history_stays_small():
    c, hist, current = cfg(), settled(2), 2
    for i in range(400):
        now = T0 + 15 * i
        s = sig(now, queue=200, running=64) if (i // 40) % 2 == 0 else sig(now, running=4, ttft=0.05)
        d = ap.decide(s, ReplicaCounts(current, current), hist, c, now)
        hist, current = d.history, d.desired_replicas
    assert len(hist.recommendations) <= 300 // 15 + 1
    assert len(hist.events) <= 10
    assert len(json.dumps(hist.to_dict())) < 4000
