"""The reactive policy's answer to an overload when a replica's saturated throughput is known: the fleet that serves
the arrival rate and drains the backlog, counting the replicas already ordered as capacity on its way.

Why: sizing on the backlog alone (each replica holding `targetQueueDepthPerReplica` waiting requests by the time a
new one can serve) buys replicas for a queue that the replicas already ordered will drain. During a cold start the
queue is larger at every pass, so every pass ordered more (issue #28: 60 of 72 scale-ups made while pods were
pending went beyond what drains the queue; issue #33: 1.7-4.2x the clairvoyant GPU-hours on bursty traffic). A
replica drains at its throughput `mu`, so the fleet follows from it:

- **Arrivals now**: the replicas that were ready at the previous queue sample are saturated (the queue is above its
  band), so they served `mu` each, and the queue's growth since that sample is what arrived beyond them. The metric
  window's rate lags a step by most of a window. (Replicas that became ready since then took their batch from the
  queue at once, which reads low for one pass: no order comes of it.)
- **The backlog a replica ordered now would meet**, one cold start from now: the queue at hand, plus the arrivals
  beyond what the fleet serves meanwhile, the ready replicas first and each pending one from when it serves (one cold
  start after the scale-up that ordered it, the newest orders being the pending ones; a pending replica with no
  scale-up on record, a whole cold start from now), less the target's share of the fleet ordered. Without pending
  replicas that is the queue plus its growth over one cold start, as the rule it replaces projected; with them, a
  backlog they will have drained by then is none: a replica ordered now would come too late to help.
- **The fleet**: square-root staffing for the arrival rate (the steady rule's `R + headroom x sqrt(R)`, so that the
  fleet left once the backlog is gone is the one the steady rule keeps and no second scale-up follows the drain),
  plus `backlog / (mu x drain time)` replicas. An overload never asks for fewer than the ready replicas.
- **Drain time** (`PolicyConfig.backlog_drain_seconds`, 20 s): the predictive policy's `drain_s`, so both policies
  answer the same backlog with the same fleet. Requests that arrive behind a backlog wait for all of it, which argues
  for short; each replica ordered for the drain is billed a cold start, the drain and a metric window of holding
  for `mu x drain time` requests served, which argues for long. It is no TTFT: a backlog's requests are late already.
- **Pending replicas** count in `current`: while any load, more are ordered only when the need exceeds the fleet
  ordered by more than the tolerance, so that the noise of a 5 s queue growth (a Poisson count's) does not ratchet
  the fleet up pass after pass; a rising arrival rate does.
"""

from __future__ import annotations

import math

from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts


def saturated_arrivals(samples, throughput: float) -> float:
    """Requests arriving per second over two or more queue samples of a saturated fleet: what the replicas ready at
    each sample served at `throughput` until the next, plus the queue's growth from the first to the last."""
    served = sum(a[3] * throughput * (b[0] - a[0]) for a, b in zip(samples, samples[1:]))
    return max(0.0, (served + samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]))


def arrivals_now(hist: ScaleHistory, throughput: float, ready: int) -> float:
    """Requests arriving per second under overload: what the replicas ready at the previous queue sample served at
    saturation, plus the queue's growth since that sample (the ready ones alone with a single sample)."""
    samples = hist.queue_samples
    if len(samples) < 2:
        return ready * throughput
    return saturated_arrivals(samples[-2:], throughput)


def pending_waves(hist: ScaleHistory, replicas: ReplicaCounts, cold_start: float,
                  now: float) -> list[tuple[float, int]]:
    """(seconds from now until they serve, replicas) of the pending replicas, soonest first: the newest scale-ups'
    replicas are the pending ones, each ready one cold start after its order (at once if that is past); those no
    scale-up on record accounts for, a whole cold start from now."""
    left, waves = replicas.pending, []
    for event in reversed(hist.events):
        ordered = event.to_replicas - event.from_replicas
        if left == 0:
            break
        if ordered > 0:
            waves.append((min(cold_start, max(0.0, event.time + cold_start - now)), min(left, ordered)))
            left -= waves[-1][1]
    if left:
        waves.append((cold_start, left))
    return sorted(waves)


def backlog_when_ordered_serves(waiting: float, arrivals: float, throughput: float, replicas: ReplicaCounts,
                                waves: list[tuple[float, int]], cold_start: float, target_queue: float) -> float:
    """The queue one cold start from now, the fleet ordered serving as its replicas come up, beyond its target."""
    queue, serving, t = waiting, replicas.ready, 0.0
    for at, count in waves + [(cold_start, 0)]:
        queue = max(0.0, queue + (arrivals - serving * throughput) * (at - t))
        serving, t = serving + count, at
    return max(0.0, queue - target_queue * replicas.current)


def arrivals_span(hist: ScaleHistory) -> float:
    """Seconds between the two queue samples `arrivals_now` measures the queue's growth over (0 with one)."""
    samples = hist.queue_samples
    return samples[-1][0] - samples[-2][0] if len(samples) >= 2 else 0.0


def drain_fleet(waiting: float, throughput: float, replicas: ReplicaCounts, hist: ScaleHistory,
                config: PolicyConfig, now: float) -> tuple[int, str, float]:
    """(replicas, why, the arrival rate sized for) under overload: the fleet that serves the arrivals and drains the
    backlog (module docstring)."""
    ready, current, mu = replicas.ready, replicas.current, throughput
    cold_start = config.cold_start_seconds
    arrivals = arrivals_now(hist, mu, ready)
    waves = pending_waves(hist, replicas, cold_start, now)
    backlog = backlog_when_ordered_serves(waiting, arrivals, mu, replicas, waves, cold_start,
                                          config.target_queue_depth_per_replica)
    load = arrivals / mu
    need = load + config.headroom * math.sqrt(load) + backlog / (mu * config.backlog_drain_seconds)
    rec = max(ready, math.ceil(need - 1e-9))
    why = (f"{arrivals:.1f} req/s arriving at {mu:g}/replica, backlog {backlog:.0f} in {cold_start:.0f}s to "
           f"drain in {config.backlog_drain_seconds:g}s: {need:.1f} replicas")
    if replicas.pending:
        why += f" ({current} ordered, {replicas.pending} pending)"
        if current < rec and need <= current * (1 + config.tolerance):
            rec = current
    return rec, why, arrivals
