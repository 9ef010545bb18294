"""The causal limit: a policy that knows the present exactly and nothing of the future (issue #33).

The clairvoyant limit (clairvoyant.py) orders each replica one cold start before the rate it must serve; no causal
policy can do that for a step. This one is the same policy without the look-ahead:

- At every tick it orders at once the fleet the present rate needs, sized by the clairvoyant's own table
  (`FleetSizing`, on the trace's own requests), with no measurement noise and no lag: it reads the trace's rate
  curve at `now` itself, not an estimate from arrivals.
- With `drain` (the default) it also orders for the backlog a step leaves, read exactly from the simulator at the
  tick, by the predictive policy's rule (`policies/predictive.py`): the queue beyond `queue_per_replica`
  per ready replica, plus what arrives beyond the ready fleet's capacity over one cold start, served within
  `drain_s` on top of the arrivals. By default `drain_s` is one second: the backlog is drained as fast as
  `max_replicas` allows, which holds the most requests within the target that a fleet ordered at the step can;
  with the predictive policy's 20 s it is that policy's own drain with perfect measurement. Without a drain (the
  fleet for the present rate alone) a step's backlog drains at what that fleet serves beyond the arrivals, and the
  requests behind it wait for all of it: any policy with a drain rule beats that.
- It releases a replica the moment the present need falls, but not while the requests admitted to the batches need
  it (a drained backlog is still in them: released then, the fleet left admits no arrival until they finish).

So it bounds the SLO share of the policies that hold no replica the present does not need: the limit minus it is
what none of them reaches, however well it measures and forecasts. A causal policy does better only by holding
replicas before they are needed (spares, a slower release), at their GPU-hours; the fixed peak-sized fleet is the
extreme of that.

A replayed trace (trace_file.py) has no curve: its rate at t is the count of its requests over a window centred
on t, which would read half a window of the future. Here it reads the window that ends at t instead (the count of
the last `RATE_WINDOW_S`), causal but behind a step by up to that window; `centred` reads the other (for
comparison: docs/benchmarks/autoscaling.md gives the bound on the trace files both ways).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kubeinfer.operator.autoscaling.policies.predictive import PredictiveConfig
from kubeinfer.operator.autoscaling.sizing.fleet_sizing import FleetSizing
from kubeinfer.operator.autoscaling.sizing.replica_model import ReplicaModel

from .observation import Observation
from .policies import TableSizing
from .sim import Trace
from .trace_file import RATE_WINDOW_S

CAUSAL = "causal limit (knows the present)"
CAUSAL_DRAIN_20 = "causal limit, 20 s drain"
CAUSAL_NO_DRAIN = "causal limit, no drain"


def present_rate(trace: Trace, t: float, centred: bool = False) -> float:
    """The trace's arrival rate at t as known at t: its curve; for a replayed trace the count over the last
    `RATE_WINDOW_S` (or, `centred`, over the window around t that its `rate` counts, which reads ahead)."""
    if trace.requests is None or centred:
        return trace.rate(t)
    return trace.rate(t - RATE_WINDOW_S / 2)


@dataclass
class CausalLimitPolicy:
    trace: Trace
    sizing: FleetSizing
    cold_start_s: float
    min_replicas: int = 1
    max_replicas: int = 20
    batch_cap: int = ReplicaModel.max_batch
    drain: bool = True
    drain_s: float = 1.0   # a backlog served within a tick, i.e. as fast as max_replicas allows (SLO first)
    queue_per_replica: float = PredictiveConfig.queue_per_replica
    tick_s: float = 1.0
    centred: bool = False   # a replayed trace's count centred on now (half a window ahead): for comparison only
    name: str = CAUSAL

    def need(self, t: float, waiting: int = 0, ready: int = 0, in_batch: int = 0) -> int:
        """The fleet the rate at t needs; with `drain`, also what drains within `drain_s` the backlog a replica
        ordered at t would meet (the `waiting` requests beyond what the `ready` replicas hold in normal running, plus
        what arrives beyond their capacity over one cold start), and at least the replicas whose batches hold the
        `in_batch` requests admitted. Pending replicas are left out of the capacity, so that the replicas ordered
        for a backlog are not released while it grows; and a drained backlog is still in the batches: released
        then, the fleet left could admit no arrival until they finish, and would order again (a cold start)."""
        sizing = TableSizing(self.sizing)
        rate = present_rate(self.trace, t, self.centred)
        held = 0
        if self.drain:
            queue = max(0.0, waiting - self.queue_per_replica * ready)
            backlog = queue + max(0.0, rate - sizing.capacity(ready)) * self.cold_start_s
            rate += backlog / self.drain_s
            held = math.ceil(in_batch / self.batch_cap)
        return min(self.max_replicas, max(self.min_replicas, sizing.replicas_for(rate), held))

    def decide(self, obs: Observation) -> int:
        alive = [r for r in obs.sim.replicas if r.terminated is None and not r.draining]
        waiting = len(obs.sim.router) + sum(len(r.waiting) for r in alive)
        in_batch = sum(len(r.running) + len(r.prefill) for r in alive)
        return self.need(obs.now, waiting, obs.ready, in_batch)
