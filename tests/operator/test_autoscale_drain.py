"""Unit tests of the reactive policy's overload rule with a known throughput per replica (`drain_sizing`): the fleet
that serves the arrivals and drains the backlog, the replicas already ordered counted as capacity on its way."""

from __future__ import annotations

from dataclasses import replace

from kubeinfer.operator.autoscaling.policies import reactive as ap
from kubeinfer.operator.autoscaling.policies.drain_sizing import pending_waves
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleEvent, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals

T0 = 1_000_000.0
MU = 4.0   # requests/s one replica serves saturated (spec throughputPerReplica)


def cfg(**kw) -> PolicyConfig:
    base = dict(max_replicas=40, min_replicas=1, initial_delay_seconds=60, max_scale_up_step=20,
                assumed_throughput_per_replica=MU)
    return PolicyConfig(**{**base, **kw})


def sig(now: float, queue: float, running: float = 32.0) -> Signals:
    return Signals(timestamp=now, queue_depth=queue, num_running=running)


def settled(ready: int, samples: tuple = ()) -> ScaleHistory:
    return ScaleHistory(started_at=T0 - 3600, last_ready=ready, ready_changed_at=T0 - 3600, last_traffic_time=T0,
                        queue_samples=samples)


def cold_start_under_steady_arrivals(config: PolicyConfig, arrivals: list[float]) -> list[ap.ScaleDecision]:
    """One ready replica (saturated, MU req/s) and a queue fed at `arrivals[k]` req/s in the k-th 5 s of a 60 s
    cold start: no replica ordered becomes ready within it. Returns each pass's decision."""
    hist, current, queue, now = settled(1, ((T0 - 5, 20.0, 32.0, 1),)), 1, 60.0, T0
    decisions = []
    for rate in arrivals:
        d = ap.decide(sig(now, queue), ReplicaCounts(current, 1, current - 1), hist, config, now)
        decisions.append(d)
        hist, current = d.history, d.desired_replicas
        queue += (rate - MU) * 5
        now += 5
    return decisions


def test_a_backlog_the_pending_replicas_will_drain_orders_nothing_more_during_their_cold_start():
    # 12 req/s arrive on 1 replica serving 4: the queue grows 8/s, 60 -> 140 -> ... over the 60 s cold start.
    decisions = cold_start_under_steady_arrivals(cfg(), [12.0] * 12)
    first, rest = decisions[0], decisions[1:]
    # 12 req/s is 3 replicas busy, 3 + 0.4 sqrt(3) = 3.7; the backlog when a replica ordered now serves,
    # 60 + 8 x 60 less the target's 4 = 536, drained in 20 s at 4 req/s: 6.7 more. 10.4 -> 11.
    assert (first.desired_replicas, first.reason) == (11, ap.SCALE_UP)
    assert "12.0 req/s arriving" in first.message and "backlog 536" in first.message
    # The queue keeps growing (to 500), but the 10 pending replicas will drain it: no pass orders more.
    assert all(d.desired_replicas == 11 and d.reason != ap.SCALE_UP for d in rest), \
        [(d.desired_replicas, d.reason) for d in rest]
    # The rule it replaces (the same signals without a throughput) ordered more at every pass of the cold start.
    old = cold_start_under_steady_arrivals(cfg(assumed_throughput_per_replica=None), [12.0] * 12)
    assert sum(d.reason == ap.SCALE_UP for d in old) > 3


def test_a_rising_arrival_rate_still_orders_more_while_replicas_load():
    # As above, but from the 4th pass 24 req/s arrive: the need rises beyond what is ordered.
    decisions = cold_start_under_steady_arrivals(cfg(), [12.0] * 3 + [24.0] * 9)
    assert [d.reason for d in decisions[1:4]] != [ap.SCALE_UP] * 3
    rises = [d for d in decisions[4:] if d.reason == ap.SCALE_UP]
    assert rises and rises[0].desired_replicas > 11 and "24.0 req/s arriving" in rises[0].message


def test_a_need_within_the_tolerance_above_the_fleet_ordered_orders_nothing_while_replicas_load():
    # 11 ordered, 10 pending (ordered 5 s ago, ready in 55 s); the queue grew 11/s in the last 5 s: 15 req/s arrive,
    # 3.75 + 0.4 sqrt(3.75) = 4.52 replicas for them; the backlog a replica ordered now would meet, 120 + 11 x 55
    # - 29 x 5 - 44 = 536, drained in 20 s: 6.7 more. 11.2 is within the tolerance (10%) above the 11 ordered: hold.
    # At 16 req/s (growth 12/s), 4.8 + (120 + 12 x 55 - 28 x 5 - 44) / 80 = 12.25, beyond it: 13.
    ordered = ScaleEvent(T0 - 5, 1, 11, ap.SCALE_UP)
    for growth, wanted in ((11.0, 11), (12.0, 13)):
        hist = replace(settled(1, ((T0 - 5, 120 - 5 * growth, 32.0, 1),)), events=(ordered,))
        d = ap.decide(sig(T0, 120.0), ReplicaCounts(11, 1, 10), hist, cfg(), T0)
        assert d.desired_replicas == wanted, (growth, d.desired_replicas, d.message)


def test_arrivals_are_what_the_replicas_ready_at_the_previous_sample_served_plus_the_growth():
    # 5 s ago 1 replica was ready, now 5 are (4 came up in between); 2 more are pending, due in 5 s. The queue grew
    # 600 -> 640: 4 + 8 = 12 req/s arrive. 7 replicas will drain it: nothing more. Counting the 5 ready now as having
    # served the whole 5 s would read 28 req/s and order 16 replicas.
    hist = replace(settled(1, ((T0 - 5, 600.0, 32.0, 1),)), events=(ScaleEvent(T0 - 55, 5, 7, ap.SCALE_UP),))
    d = ap.decide(sig(T0, 640.0, running=160.0), ReplicaCounts(7, 5, 2), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason) == (7, ap.PENDING_REPLICAS) and "12.0 req/s arriving" in d.message


def test_a_backlog_draining_on_the_ready_fleet_orders_nothing():
    # 40 waiting on 4 ready replicas (above the band of 4 each), but the queue fell by 40 in 5 s: 16 - 8 = 8 req/s
    # arrive and the fleet drains the rest within a cold start: the ready count holds (the old rule ordered one).
    hist = settled(4, ((T0 - 5, 80.0, 128.0, 4),))
    d = ap.decide(sig(T0, 40.0, running=128.0), ReplicaCounts(4, 4), hist, cfg(), T0)
    assert (d.desired_replicas, d.reason, d.recommendation) == (4, ap.WITHIN_TOLERANCE, 4)
    old = ap.decide(sig(T0, 40.0, running=128.0), ReplicaCounts(4, 4), hist, cfg(assumed_throughput_per_replica=None),
                    T0)
    assert old.desired_replicas == 5


def test_without_a_throughput_the_backlog_rule_stands_and_with_one_the_drain_rule_sizes():
    # tests/operator/test_autoscale_policy.py::test_a_growing_queue_is_projected_over_the_loading_time's signals:
    # 2 ready at 32 running each, queue 20 -> 60 in 10 s.
    hist = replace(settled(2), queue_samples=((T0 - 10, 20.0, 64.0, 2),))
    backlog_rule = ap.decide(sig(T0, 60.0, running=64.0), ReplicaCounts(2, 2), hist,
                             cfg(assumed_throughput_per_replica=None), T0)
    assert backlog_rule.recommendation == 11 and "growing 4.0/s over a 60s cold start" in backlog_rule.message
    # With 4 req/s a replica: 8 + 4 = 12 req/s arrive, 3.69 replicas for them, and the backlog when a replica
    # ordered now serves, 60 + 4 x 60 - 8 = 292, drained in 20 s: 3.65 more. 7.3 -> 8.
    drain_rule = ap.decide(sig(T0, 60.0, running=64.0), ReplicaCounts(2, 2), hist, cfg(), T0)
    assert drain_rule.recommendation == 8 and "backlog 292" in drain_rule.message
    # A higher measured throughput raises the spec's, as in the steady rule: at 8 req/s a replica, 16 + 4 = 20 arrive.
    measured = ap.decide(sig(T0, 60.0, running=64.0), ReplicaCounts(2, 2), replace(hist, throughput_per_replica=8.0),
                         cfg(), T0)
    assert "20.0 req/s arriving at 8/replica" in measured.message


def test_pending_waves_take_the_newest_orders_as_the_pending_replicas():
    events = (ScaleEvent(T0 - 100, 1, 3, ap.SCALE_UP), ScaleEvent(T0 - 50, 3, 2, ap.SCALE_DOWN),
              ScaleEvent(T0 - 40, 2, 6, ap.SCALE_UP), ScaleEvent(T0 - 10, 6, 8, ap.SCALE_UP))
    hist = ScaleHistory(events=events)
    # 5 pending: the 2 ordered 10 s ago (ready in 50 s) and 3 of the 4 ordered 40 s ago (in 20 s).
    assert pending_waves(hist, ReplicaCounts(8, 3, 5), 60.0, T0) == [(20.0, 3), (50.0, 2)]
    # An order older than a cold start is overdue: it serves at once, as far as the rule can know.
    assert pending_waves(hist, ReplicaCounts(8, 2, 6), 30.0, T0) == [(0.0, 4), (20.0, 2)]
    # Pending replicas no scale-up on record accounts for serve a whole cold start from now.
    assert pending_waves(ScaleHistory(), ReplicaCounts(3, 1, 2), 60.0, T0) == [(60.0, 2)]
    assert pending_waves(hist, ReplicaCounts(8, 8, 0), 60.0, T0) == []
