"""The autoscaling policy: a pure function of (signals, replica counts, history, config, now).

`decide()` returns the desired replica count, a reason, and the history to keep for the next call.
It reads no clock and does no I/O; the operator's timer feeds it and applies the result.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from kubeinfer.operator.autoscale_types import (
    PolicyConfig,
    ReplicaCounts,
    ScaleDecision,
    ScaleEvent,
    ScaleHistory,
    Signals,
)

log = logging.getLogger(__name__)

# Reasons (constant words, used as Event reasons and in status).
SCALE_UP = "ScaleUp"
SCALE_DOWN = "ScaleDown"
SCALE_TO_ZERO = "ScaleToZero"
SCALE_FROM_ZERO = "ScaleFromZero"
WITHIN_TOLERANCE = "WithinTolerance"
STABILIZING_UP = "StabilizingUp"
STABILIZING_DOWN = "StabilizingDown"
PENDING_REPLICAS = "PendingReplicas"
METRICS_UNAVAILABLE = "MetricsUnavailable"
METRICS_STALE = "MetricsStale"
BELOW_MIN = "BelowMinReplicas"
ABOVE_MAX = "AboveMaxReplicas"


# Policy, in order:
# 1. Bounds are absolute: a count above maxReplicas is brought down to it, one below the floor up to it,
#    whatever the metrics say. The floor is minReplicas; with minReplicas 0 it is 1 while there is
#    traffic, and 0 only when the service is already at zero or has seen no traffic for
#    scaleToZeroIdleSeconds.
# 2. Missing or stale metrics hold the current count (within bounds): never a scale-down, never to
#    zero on missing data. Unknown counts as traffic for the idle clock.
# 3. Otherwise each signal recommends a count and the larger wins (see `_recommend`).
# 4. Scale-up acts on the lowest recommendation of the last scaleUpStabilizationSeconds (0: at once),
#    adding at most maxScaleUpStep replicas per decision.
# 5. Scale-down acts on the highest recommendation of the last scaleDownStabilizationSeconds, removes
#    at most maxScaleDownStep per decision, and never while a replica is pending or loading. A history
#    younger than that window counts the current size as a recommendation (a fresh or restarted
#    operator never scales down before one full window of its own observations). Scale to zero is the
#    exception: the idle period is its own stabilization, so it goes straight to 0.
def decide(signals: Signals, replicas: ReplicaCounts, history: ScaleHistory, config: PolicyConfig,
           now: float) -> ScaleDecision:
    current = replicas.current
    hist = _observe_ready(history, replicas, now)
    if hist.started_at is None:
        hist = replace(hist, started_at=now)

    if not signals.available or now - signals.timestamp > config.stale_after_seconds:
        reason = METRICS_UNAVAILABLE if not signals.available else METRICS_STALE
        hist = replace(hist, last_traffic_time=now)
        floor = _floor(config, current, idle=False)
        desired = min(max(current, floor), config.max_replicas)
        detail = signals.error or f"signals are {now - signals.timestamp:.0f}s old"
        return _finish(current, desired, reason, f"holding {current}: {detail}", hist, None, now)

    traffic = signals.has_traffic
    last_traffic = now if traffic or hist.last_traffic_time is None else hist.last_traffic_time
    hist = replace(hist, last_traffic_time=last_traffic)
    # Saturation capacity is measured only when the queue is at its target on a fully ready fleet
    # (a request waiting for the next engine step is not saturation; a loading replica runs nothing).
    if (replicas.ready > 0 and replicas.pending == 0 and signals.num_running
            and (signals.queue_depth or 0) >= config.target_queue_depth_per_replica * replicas.ready * (1 - config.tolerance)):
        hist = replace(hist, capacity_per_replica=signals.num_running / replicas.ready)

    idle = config.min_replicas == 0 and not traffic and now - last_traffic >= config.scale_to_zero_idle_seconds
    floor = _floor(config, current, idle)
    if current > config.max_replicas:
        return _finish(current, config.max_replicas, ABOVE_MAX, f"maxReplicas is {config.max_replicas}",
                       hist, None, now)
    if current < floor:
        reason = SCALE_FROM_ZERO if current == 0 else BELOW_MIN
        return _finish(current, floor, reason, f"floor is {floor}", hist, None, now)

    rec, why = _recommend(signals, replicas, hist, config, now)
    if idle:
        rec, why = 0, f"no traffic for {now - last_traffic:.0f}s"
    rec = min(max(rec, floor), config.max_replicas)
    hist = _record(hist, rec, now, config)

    if rec > current:
        window = [n for t, n in hist.recommendations if t >= now - config.scale_up_stabilization_seconds]
        stable_up = min(window) if config.scale_up_stabilization_seconds > 0 else rec
        if stable_up <= current:
            return _finish(current, current, STABILIZING_UP, f"{why}; waiting for it to hold", hist, rec, now)
        desired = min(stable_up, current + config.max_scale_up_step)
        return _finish(current, desired, SCALE_FROM_ZERO if current == 0 else SCALE_UP, why, hist, rec, now)

    if rec < current:
        if replicas.pending > 0:
            return _finish(current, current, PENDING_REPLICAS,
                           f"{why}; {replicas.pending} replica(s) still pending or loading", hist, rec, now)
        if rec == 0 and idle:
            return _finish(current, 0, SCALE_TO_ZERO, why, hist, rec, now)
        window = [n for t, n in hist.recommendations if t >= now - config.scale_down_stabilization_seconds]
        stable_down = max(window)
        if now - hist.started_at < config.scale_down_stabilization_seconds:
            stable_down = max(stable_down, current)
        if stable_down >= current:
            return _finish(current, current, STABILIZING_DOWN, f"{why}; waiting for the window", hist, rec, now)
        desired = max(stable_down, current - config.max_scale_down_step)
        return _finish(current, desired, SCALE_DOWN, why, hist, rec, now)

    return _finish(current, current, WITHIN_TOLERANCE, why, hist, rec, now)


# Recommendation of each signal; the larger wins.
# - Queue: when waiting requests per ready replica exceed the target (beyond the tolerance), the
#   replicas are saturated at their present running batch, so the fleet that leaves `target` waiting
#   per replica is (running + waiting) / (running per replica + target). Below the band, the fleet that
#   holds all present requests without queueing at the measured saturation capacity (less the
#   tolerance as headroom) is enough; before any saturation was measured, the same formula as above
#   (one step at a time, so the policy learns the capacity). Inside the band: keep the ready count.
#   Nothing ready: waiting / (capacity + target), or waiting / target when capacity is unknown.
# - TTFT P95: above the band it multiplies the ready count by the ratio (at most
#   max_ttft_scale_up_ratio, at least +1), but only when every replica is ready and the ready count has
#   been stable for half a metric window: the P95 is a windowed, lagging signal that must mostly
#   describe the present fleet before it adds more. Inside the band it keeps the ready count; below it,
#   or with no first token in the window, it has no objection.
def _recommend(signals: Signals, replicas: ReplicaCounts, hist: ScaleHistory, config: PolicyConfig,
               now: float) -> tuple[int, str]:
    ready, tol = replicas.ready, config.tolerance
    waiting = signals.queue_depth or 0.0
    running = signals.num_running or 0.0
    target_q = config.target_queue_depth_per_replica
    capacity = hist.capacity_per_replica or config.assumed_capacity_per_replica

    if ready == 0:
        rec_q = math.ceil(waiting / ((capacity or 0.0) + target_q)) if waiting > 0 else 0
        rec_q = max(rec_q, replicas.current)  # replicas still loading are not evidence for fewer
        why_q = f"{waiting:.0f} waiting, no ready replica"
    else:
        queue_ratio = waiting / ready / target_q
        per_replica = running / ready
        if queue_ratio > 1 + tol:
            rec_q = max(ready + 1, math.ceil((running + waiting) / (per_replica + target_q)))
        elif queue_ratio >= 1 - tol:
            rec_q = ready
        elif capacity:
            rec_q = min(ready, math.ceil((running + waiting) / (capacity * (1 - tol))))
        else:
            rec_q = min(ready, math.ceil((running + waiting) / (per_replica + target_q)))
        why_q = f"queue {waiting:.0f} on {ready} ready (target {target_q:g}/replica)"

    rec_t, why_t = 0, ""
    ttft = signals.ttft_p95_seconds
    if ttft is not None and math.isfinite(ttft) and ready > 0:
        ratio = ttft / config.target_ttft_p95_seconds
        settled = (replicas.pending == 0 and hist.ready_changed_at is not None
                   and now - hist.ready_changed_at >= config.metric_window_seconds / 2)
        if ratio > 1 + tol:
            rec_t = max(ready + 1, math.ceil(ready * min(ratio, config.max_ttft_scale_up_ratio))) if settled \
                else replicas.current
        elif ratio >= 1 - tol:
            rec_t = ready
        why_t = f"TTFT P95 {ttft:.3f}s (target {config.target_ttft_p95_seconds:g}s)"

    if rec_t > rec_q:
        return rec_t, why_t
    return rec_q, why_q + (f", {why_t}" if why_t else "")


def _floor(config: PolicyConfig, current: int, idle: bool) -> int:
    if config.min_replicas > 0:
        return config.min_replicas
    return 0 if idle or current == 0 else 1


def _observe_ready(hist: ScaleHistory, replicas: ReplicaCounts, now: float) -> ScaleHistory:
    if hist.last_ready == replicas.ready:
        return hist
    return replace(hist, last_ready=replicas.ready, ready_changed_at=now)


def _record(hist: ScaleHistory, rec: int, now: float, config: PolicyConfig) -> ScaleHistory:
    keep = max(config.scale_up_stabilization_seconds, config.scale_down_stabilization_seconds)
    recs = tuple((t, n) for t, n in hist.recommendations if t >= now - keep) + ((now, rec),)
    return replace(hist, recommendations=recs)


def _finish(current: int, desired: int, reason: str, message: str, hist: ScaleHistory, rec: int | None,
            now: float) -> ScaleDecision:
    if desired != current:
        hist = hist.with_event(ScaleEvent(now, current, desired, reason))
        log.info("autoscale %s: %d -> %d (%s)", reason, current, desired, message)
    return ScaleDecision(desired_replicas=desired, reason=reason, message=message, history=hist,
                         recommendation=rec)
