"""No replica stacked on pending pods (`pending_guard`): while the replicas of the last scale-up are pending, the
reactive policy orders more only for an arrival rate risen beyond the one that scale-up was sized for, by more than
the tolerance and three standard errors of the counts it is measured from, the rate now read over the last pass and
pooled since the order (issue #28)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kubeinfer.operator.autoscaling.policies import reactive as ap
from kubeinfer.operator.autoscaling.policies.pending_guard import risen
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleEvent, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals

T0 = 1_000_000.0
MU = 2.0   # requests/s one replica serves saturated (spec throughputPerReplica)


def cfg(**kw) -> PolicyConfig:
    base = dict(max_replicas=20, min_replicas=1, initial_delay_seconds=20, max_scale_up_step=20,
                assumed_throughput_per_replica=MU)
    return PolicyConfig(**{**base, **kw})


def ordered(to: int, sized_for: tuple[float, int, float] | None, arriving: float, ready: int = 1) -> tuple:
    """A history 10 s after a scale-up 1 -> `to` (sized for `sized_for`), its replicas pending, and the signals of a
    pass whose queue grew from 40 over the last 5 s as `arriving` req/s on the `ready` saturated replicas."""
    hist = ScaleHistory(started_at=T0 - 3600, last_ready=ready, ready_changed_at=T0 - 3600, last_traffic_time=T0,
                        queue_samples=((T0 - 5, 40.0, 4.0 * ready, ready),),
                        events=(ScaleEvent(T0 - 10, 1, to, ap.SCALE_UP),), scale_up_sized_for=sized_for)
    signals = Signals(timestamp=T0, queue_depth=40.0 + 5 * (arriving - ready * MU), num_running=4.0 * ready)
    return hist, signals


def test_a_reading_within_the_noise_of_the_rate_ordered_for_orders_nothing_more():
    # 5 ordered for 7 req/s measured over 5 s, 4 pending. This pass's queue growth reads 9 req/s over 5 s: 29% above,
    # but the difference of two 5 s counts at 8 req/s has a standard error of 1.8 req/s, and 2 is within three.
    # Sized anew, 9 req/s and the backlog the pending replicas meet would be 8.2 replicas: the policy without the
    # guard orders 4 more for the same traffic.
    hist, signals = ordered(5, (7.0, 5, 5.0), arriving=9.0)
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason) == (5, ap.PENDING_REPLICAS), d.message
    assert d.recommendation == 9 and "no rise beyond it" in d.message and "9.0 req/s arriving" in d.message
    unguarded = ap.decide(signals, ReplicaCounts(5, 1, 4), replace(hist, scale_up_sized_for=None), cfg(), T0)
    assert (unguarded.desired_replicas, unguarded.reason) == (9, ap.SCALE_UP)


def test_a_rate_risen_beyond_the_tolerance_and_the_noise_orders_more_and_is_remembered():
    # 14 req/s against the 7 ordered for: a burst's step. It orders, and the next pass compares with 14.
    hist, signals = ordered(5, (7.0, 5, 5.0), arriving=14.0)
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(), T0)
    assert d.reason == ap.SCALE_UP and d.desired_replicas > 5
    assert d.history.scale_up_sized_for == (pytest.approx(14.0), d.recommendation, 5.0)


def test_a_scale_up_held_back_by_max_scale_up_step_goes_on_towards_its_recommendation():
    # 1 -> 5 of a recommendation of 9 (maxScaleUpStep 4), for 9 req/s: the next pass, at the same rate, orders the
    # rest of the same recommendation; it orders nothing beyond it.
    hist, signals = ordered(5, (9.0, 9, 5.0), arriving=9.0)
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(max_scale_up_step=4), T0)
    assert (d.desired_replicas, d.reason) == (9, ap.SCALE_UP)
    assert d.history.scale_up_sized_for == (9.0, 9, 5.0)
    hist, signals = ordered(5, (9.0, 7, 5.0), arriving=9.0)
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(max_scale_up_step=4), T0)
    assert (d.desired_replicas, d.reason) == (7, ap.SCALE_UP) and "no rise beyond it" in d.message
    assert d.history.scale_up_sized_for == (9.0, 7, 5.0)   # the cut order is no new sizing


def test_with_nothing_pending_the_guard_is_off():
    # 5 ordered for 9 req/s are all ready and serve 10; 10 arrive (no rise beyond 9: within the noise), but the 40
    # waiting are above the band (4 a replica): 5 + 0.4 sqrt(5) + 20 / 40 = 6.4 -> 7. The backlog the pending replicas
    # were to drain is the ready fleet's now, and the next pass answers it from that fleet.
    hist, signals = ordered(5, (9.0, 5, 5.0), arriving=10.0, ready=5)
    d = ap.decide(signals, ReplicaCounts(5, 5, 0), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason) == (7, ap.SCALE_UP), d.message


def test_the_sizing_is_kept_in_status_so_a_restarted_operator_holds_the_same_guard():
    # A scale-up from a settled fleet (nothing pending) records what it was sized for ...
    hist, signals = ordered(1, None, arriving=7.0)
    first = ap.decide(signals, ReplicaCounts(1, 1, 0), hist, cfg(), T0)
    assert first.reason == ap.SCALE_UP and first.history.scale_up_sized_for is not None
    stored = json.loads(json.dumps(first.history.to_dict()))
    assert stored["scaleUpSizedFor"] == {"arrivalRate": pytest.approx(7.0), "replicas": first.recommendation,
                                         "spanSeconds": 5.0}
    # ... and read back from status, it holds the next pass at the same rate, as it would in the same process.
    restarted = ScaleHistory.from_dict(stored)
    assert restarted.scale_up_sized_for == first.history.scale_up_sized_for
    later = Signals(timestamp=T0 + 5, queue_depth=signals.queue_depth + 5 * (8.0 - MU), num_running=4.0)
    n = first.desired_replicas
    for history in (first.history, restarted):
        d = ap.decide(later, ReplicaCounts(n, 1, n - 1), history, cfg(), T0 + 5)
        assert (d.desired_replicas, d.reason) == (n, ap.PENDING_REPLICAS), d.message
    assert ScaleHistory.from_dict({**stored, "scaleUpSizedFor": None}).scale_up_sized_for is None


def test_a_rise_is_beyond_both_the_tolerance_and_three_standard_errors_of_the_difference_of_the_counts():
    # At 100 req/s, two 5 s counts: the noise (3 sqrt(110 x (1/5 + 1/5)) = 19.9 at the two counts' pooled rate) is
    # above the 10% tolerance: it decides.
    assert not risen(119.8, 5.0, 100.0, 5.0, 0.1) and risen(120.0, 5.0, 100.0, 5.0, 0.1)
    # Over 60 s each (5.5) the tolerance decides.
    assert not risen(110.0, 60.0, 100.0, 60.0, 0.1) and risen(110.5, 60.0, 100.0, 60.0, 0.1)
    # Both counts are noisy: 5 req/s over 5 s against 5 req/s over 5 s needs 5.2 more; against a 60 s window's, 3.2.
    assert not risen(10.2, 5.0, 5.0, 5.0, 0.1) and risen(10.3, 5.0, 5.0, 5.0, 0.1)
    assert not risen(8.1, 5.0, 5.0, 60.0, 0.1) and risen(8.3, 5.0, 5.0, 60.0, 0.1)
    # The noise is that of the rate both would share: a low remembered reading does not make it small.
    assert not risen(8.8, 5.0, 4.9, 5.0, 0.1)
    # A rate measured over no span (one queue sample) shows no rise, nor one against such a rate.
    assert not risen(50.0, 0.0, 5.0, 5.0, 0.1) and not risen(50.0, 5.0, 5.0, 0.0, 0.1)


def since_order(rates: tuple[float, float, float], waiting0: float = 40.0) -> tuple:
    """A history 16 s after a scale-up 1 -> 5 sized for 5 req/s over 5 s, 4 pending, one ready replica saturated:
    queue samples at the order (-16 s), -10 and -5 s, the pass's at 0, the arrivals of each interval `rates`."""
    times, waiting, samples = (T0 - 16, T0 - 10, T0 - 5, T0), waiting0, []
    for (t, t_next), rate in zip(zip(times, times[1:]), rates):
        samples.append((t, waiting, 4.0, 1))
        waiting += (rate - MU) * (t_next - t)
    hist = ScaleHistory(started_at=T0 - 3600, last_ready=1, ready_changed_at=T0 - 3600, last_traffic_time=T0,
                        queue_samples=tuple(samples), events=(ScaleEvent(T0 - 15, 1, 5, ap.SCALE_UP),),
                        scale_up_sized_for=(5.0, 5, 5.0))
    return hist, Signals(timestamp=T0, queue_depth=waiting, num_running=4.0)


def test_one_high_pass_within_the_noise_orders_nothing():
    # 5 req/s for 11 s, then a pass whose 5 s reads 9.5: against the 5 ordered for, 4.5 more, within three standard
    # errors of the difference at the rate both would share (5.1); since the order, 16 s read 6.4, its last 10 s 7.2:
    # the pass holds.
    hist, signals = since_order((5.0, 5.0, 9.5))
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason) == (5, ap.PENDING_REPLICAS), d.message
    assert "6.4 req/s over 16s, 7.2 req/s over 10s is no rise" in d.message


def test_a_step_each_pass_reads_within_its_noise_is_found_by_the_count_since_the_order():
    # 10 req/s since the order sized for 5: each pass alone is within its noise (5 < 5.2), 16 s of it are not.
    assert not risen(10.0, 5.0, 5.0, 5.0, 0.1) and risen(10.0, 16.0, 5.0, 5.0, 0.1)
    hist, signals = since_order((10.0, 10.0, 10.0))
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(), T0)
    assert d.reason == ap.SCALE_UP and d.desired_replicas > 5, d.message


def test_a_step_since_the_order_orders():
    hist, signals = since_order((15.0, 15.0, 15.0))
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(), T0)
    assert d.reason == ap.SCALE_UP and d.desired_replicas > 5, d.message


def test_without_saturation_since_the_order_only_the_pass_reading_counts():
    # The queue was within its band at the order's sample (4 waiting on 1 ready): the ready replica may have served
    # less than its throughput, so no rate since then is read, and the pass's own 5 s (10 req/s) is within its noise.
    hist, signals = since_order((10.0, 10.0, 10.0), waiting0=4.0)
    d = ap.decide(signals, ReplicaCounts(5, 1, 4), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason) == (5, ap.PENDING_REPLICAS), d.message
    assert "10.0 req/s over 5s is no rise" in d.message
