"""A measured throughput per replica raises the spec's `throughputPerReplica`, never lowers it
(`observations.saturation_throughput`): the learner counts a window 75% busy as saturated, so what it measures is a
lower bound of what a replica serves (issue #28: 73 of 136 drain-rule scale-ups were sized at 1.33-1.88 req/s a
replica against the real 2, and ordered up to 50% too many)."""

from __future__ import annotations

from dataclasses import replace

from kubeinfer.operator.autoscaling.policies import reactive as ap
from kubeinfer.operator.autoscaling.policies.observations import saturation_throughput
from kubeinfer.operator.autoscaling.policies.predictive_pass import PREDICTIVE_UP
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals
from support.autoscale_objects import NOW, body, plan, pod, settled_status

T0 = 1_000_000.0


def cfg(**kw) -> PolicyConfig:
    base = dict(max_replicas=40, min_replicas=1, initial_delay_seconds=60, max_scale_up_step=20)
    return PolicyConfig(**{**base, **kw})


def settled(ready: int, **kw) -> ScaleHistory:
    return ScaleHistory(started_at=T0 - 3600, last_ready=ready, ready_changed_at=T0 - 3600, last_traffic_time=T0,
                        **kw)


def test_the_larger_of_the_given_and_the_measured_throughput_sizes():
    given = cfg(assumed_throughput_per_replica=2.0)
    assert saturation_throughput(settled(1, throughput_per_replica=1.4), given) == 2.0
    assert saturation_throughput(settled(1, throughput_per_replica=2.6), given) == 2.6
    assert saturation_throughput(settled(1), given) == 2.0
    assert saturation_throughput(settled(1, throughput_per_replica=1.4), cfg()) == 1.4   # nothing given: measured
    assert saturation_throughput(settled(1), cfg()) is None


def test_a_measured_throughput_below_the_given_one_does_not_size_the_steady_fleet():
    # 8 req/s over the window, 2 given, 1.5 measured: at 2, 4 + 0.4 x 2 = 4.8 -> 5 replicas; at 1.5 it would be
    # 5.33 + 0.4 x 2.31 = 6.3 -> 7.
    hist = settled(3, throughput_per_replica=1.5)
    d = ap.decide(Signals(T0, queue_depth=0, num_running=10, request_rate=8.0), ReplicaCounts(3, 3), hist,
                  cfg(assumed_throughput_per_replica=2.0), T0)
    assert d.recommendation == 5 and "4.00 replicas busy" in d.message, d.message


def test_a_measured_throughput_below_the_given_one_does_not_size_the_drain():
    # tests/operator/test_autoscale_drain.py's signals: 2 ready at 32 running each, queue 20 -> 60 in 10 s, 4 req/s a
    # replica given: 12 req/s arrive and the fleet is 8. A measured 2.5 req/s a replica would read 9 req/s arriving
    # at 2.5 and order 11.
    hist = settled(2, throughput_per_replica=2.5, queue_samples=((T0 - 10, 20.0, 64.0, 2),))
    d = ap.decide(Signals(T0, queue_depth=60.0, num_running=64.0), ReplicaCounts(2, 2), hist,
                  cfg(assumed_throughput_per_replica=4.0), T0)
    assert d.recommendation == 8 and "12.0 req/s arriving at 4/replica" in d.message, d.message


def test_the_predictive_policy_sizes_with_the_given_throughput_over_a_lower_measured_one():
    # tests/operator/test_autoscaler_predictive_pass.py::test_orders_the_forecast_fleet_and_writes_its_state_and_reasons
    # with a measured 1.0 req/s a replica in the history: still 2 a replica, 6 replicas (at 1.0, 8: the ceiling).
    status = settled_status(2)
    status["scalingHistory"]["throughputPerReplica"] = 1.0
    b = body(replicas=2, status=status, policy="predictive", throughputPerReplica=2)
    p = plan(b, Signals(NOW, queue_depth=0, num_running=4, ttft_p95_seconds=0.2, request_rate=10.0),
             [pod("a"), pod("b")])
    assert (p.decision.desired_replicas, p.decision.reason) == (6, PREDICTIVE_UP)
    assert p.status["predictive"]["forecast"]["ratePerReplica"] == 2.0


def test_a_measured_throughput_above_the_given_one_still_raises_it():
    hist = replace(settled(3), throughput_per_replica=8.0)
    d = ap.decide(Signals(T0, queue_depth=0, num_running=10, request_rate=8.0), ReplicaCounts(3, 3), hist,
                  cfg(assumed_throughput_per_replica=2.0), T0)
    assert d.recommendation == 2   # 1 + 0.4 = 1.4 -> 2
