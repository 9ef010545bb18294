"""The autoscaling policy: a pure function of (signals, replica counts, history, config, now).

`decide()` returns the desired replica count, a reason, and the history to keep for the next call.
It reads no clock and does no I/O; the operator's timer feeds it and applies the result. What it keeps and
learns from each observation (queue samples, arrival rate, saturation capacity) is in `observations`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from kubeinfer.operator.autoscaling.policies.drain_sizing import arrivals_span, drain_fleet
from kubeinfer.operator.autoscaling.policies.observations import (
    arrival_rate, learn_capacity, observe_queue, observe_ready, overloaded_in_window, queue_growth,
    saturation_throughput,
)
from kubeinfer.operator.autoscaling.policies.pending_guard import held_for_pending
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleDecision, ScaleEvent, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals

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
# 3. Otherwise each signal recommends a count and the larger wins (see `_recommend`). A recommendation
#    made under overload (queue or TTFT above target) is marked as such.
# 4. Scale-up acts on the lowest recommendation of the last scaleUpStabilizationSeconds (0: at once),
#    adding at most maxScaleUpStep replicas, or the current count if that is more (doubling), per decision.
#    While replicas are pending, a recommendation sized for an arrival rate goes beyond the fleet ordered and
#    the last scale-up's recommendation only for a rate risen beyond that scale-up's (`pending_guard`).
# 5. Scale-down acts on the highest recommendation still in force, removes at most maxScaleDownStep per
#    decision, and never while a replica is pending or loading. A steady recommendation stays in force
#    for scaleDownStabilizationSeconds; an overload one for one metric window only: once the backlog it
#    answered is gone, the windowed arrival rate, not the backlog, says what the fleet must hold. A
#    history younger than the window counts the current size as a recommendation (a fresh or restarted
#    operator never scales down before one full window of its own observations). Scale to zero is the
#    exception: the idle period is its own stabilization, so it goes straight to 0.
def decide(signals: Signals, replicas: ReplicaCounts, history: ScaleHistory, config: PolicyConfig,
           now: float) -> ScaleDecision:
    current = replicas.current
    hist = observe_ready(history, replicas, now)
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
    hist = learn_capacity(observe_queue(hist, signals, replicas, config), signals, replicas, config)

    idle = config.min_replicas == 0 and not traffic and now - last_traffic >= config.scale_to_zero_idle_seconds
    floor = _floor(config, current, idle)
    if current > config.max_replicas:
        return _finish(current, config.max_replicas, ABOVE_MAX, f"maxReplicas is {config.max_replicas}",
                       hist, None, now)
    if current < floor:
        reason = SCALE_FROM_ZERO if current == 0 else BELOW_MIN
        return _finish(current, floor, reason, f"floor is {floor}", hist, None, now)

    rec, why, overload, arrivals = _recommend(signals, replicas, hist, config, now)
    if idle:
        rec, why, overload = 0, f"no traffic for {now - last_traffic:.0f}s", False
    rec = min(max(rec, floor), config.max_replicas)
    hist = _record(hist, rec, overload, now, config)

    if rec > current:
        allowed, held = held_for_pending(rec, arrivals, replicas, hist, config)
        if held:
            why = f"{why}; {held}"
            if allowed <= current:
                return _finish(current, current, PENDING_REPLICAS, why, hist, rec, now)
        up_window = config.scale_up_stabilization_seconds
        window = [n for t, n, _ in hist.recommended_in_window(now) if t >= now - up_window]
        stable_up = min(min(window), allowed) if config.scale_up_stabilization_seconds > 0 else allowed
        if stable_up <= current:
            return _finish(current, current, STABILIZING_UP, f"{why}; waiting for it to hold", hist, rec, now)
        desired = min(stable_up, current + max(config.max_scale_up_step, current))
        if not held:
            hist = replace(hist, scale_up_sized_for=None if arrivals is None else (arrivals[0], rec, arrivals[1]))
        return _finish(current, desired, SCALE_FROM_ZERO if current == 0 else SCALE_UP, why, hist, rec, now)

    if rec < current:
        if replicas.pending > 0:
            return _finish(current, current, PENDING_REPLICAS,
                           f"{why}; {replicas.pending} replica(s) still pending or loading", hist, rec, now)
        if rec == 0 and idle:
            return _finish(current, 0, SCALE_TO_ZERO, why, hist, rec, now)
        stable_down = max(n for t, n, o in hist.recommended_in_window(now) if t >= now - _in_force(config, o))
        if now - hist.started_at < config.scale_down_stabilization_seconds:
            stable_down = max(stable_down, current)
        if stable_down >= current:
            return _finish(current, current, STABILIZING_DOWN, f"{why}; waiting for the window", hist, rec, now)
        desired = max(stable_down, current - config.max_scale_down_step)
        return _finish(current, desired, SCALE_DOWN, why, hist, rec, now)

    return _finish(current, current, WITHIN_TOLERANCE, why, hist, rec, now)


# Recommendation of each signal; the larger wins. Returns (replicas, why, made under overload, and the arrival rate
# it was sized for with the seconds it was measured over, or None: `pending_guard`).
# - Queue above the band (overload): the replicas are saturated at their present running batch. With a
#   saturation throughput per replica (measured, or spec throughputPerReplica): the fleet that serves the
#   arrivals now and drains the backlog within backlog_drain_seconds, the replicas already ordered counted as
#   capacity on its way, never fewer than the ready ones (`drain_sizing`). Without one: the fleet that, by the
#   time a new replica can serve (the cold start learned from the service's pods, else initialDelaySeconds),
#   holds every request present and every one the queue's present growth adds meanwhile, each replica running
#   its present batch with `target` waiting: (running + waiting + growth * cold start) / (running per replica
#   + target), at least one more than the ready count.
# - Queue inside the band: keep the ready count.
# - Queue below the band (steady): with a saturation throughput per replica (measured, or else
#   spec.autoscaling.throughputPerReplica), square-root staffing for the arrival rate of the last
#   window: R + headroom * sqrt(R) replicas for an offered load of R = arrivals / throughput. This
#   one may also scale up, ahead of any queue. It keeps the ready count while the need is within the
#   tolerance below it. Without a throughput, (running + waiting) / (running per replica + target),
#   which steps down one at a time until the fleet is seen busy once.
#   Nothing ready: waiting / (capacity + target), or waiting / target.
# - TTFT P95 above the band (overload): the ready count times the ratio (at most
#   max_ttft_scale_up_ratio, at least +1), but only when every replica is ready, the ready count has
#   been stable for a whole metric window and the queue was not above its band in it: the P95 is
#   windowed, so before that it describes a fleet that no longer exists or a backlog the queue rule
#   already answered; then it only holds the ready count (overload: held for one metric window).
#   Inside the band it keeps the ready count; below it, or with no first token in the window, it has
#   no objection.
def _recommend(signals: Signals, replicas: ReplicaCounts, hist: ScaleHistory, config: PolicyConfig,
               now: float) -> tuple[int, str, bool, tuple[float, float] | None]:
    ready, tol = replicas.ready, config.tolerance
    waiting = signals.queue_depth or 0.0
    running = signals.num_running or 0.0
    target_q = config.target_queue_depth_per_replica
    capacity = hist.capacity_per_replica or config.assumed_capacity_per_replica
    throughput = saturation_throughput(hist, config)

    overload_q, arrivals_q = False, None
    if ready == 0:
        rec_q = math.ceil(waiting / ((capacity or 0.0) + target_q)) if waiting > 0 else 0
        rec_q = max(rec_q, replicas.current)  # replicas still loading are not evidence for fewer
        why_q = f"{waiting:.0f} waiting, no ready replica"
        overload_q = waiting > 0
    else:
        queue_ratio = waiting / ready / target_q
        per_replica = running / ready
        why_q = f"queue {waiting:.0f} on {ready} ready (target {target_q:g}/replica)"
        if queue_ratio > 1 + tol and throughput:
            rec_q, why_drain, rate = drain_fleet(waiting, throughput, replicas, hist, config, now)
            why_q, overload_q, arrivals_q = f"{why_q}, {why_drain}", True, (rate, arrivals_span(hist))
        elif queue_ratio > 1 + tol:
            growth = max(0.0, queue_growth(hist))
            horizon = config.cold_start_seconds
            projected = running + waiting + growth * horizon
            rec_q = max(ready + 1, math.ceil(projected / (per_replica + target_q)))
            overload_q = True
            if growth > 0:
                why_q += f", growing {growth:.1f}/s over a {horizon:.0f}s cold start"
        elif queue_ratio >= 1 - tol:
            rec_q = ready
        elif throughput:
            arrivals = arrival_rate(hist, signals)
            load = arrivals / throughput
            need = load + config.headroom * math.sqrt(load)
            rec_q = ready if ready * (1 - tol) <= need <= ready else math.ceil(need - 1e-9)
            why_q += f", {arrivals:.2f} req/s = {load:.2f} replicas busy"
            arrivals_q = (arrivals, float(config.metric_window_seconds))
        else:
            rec_q = min(ready, math.ceil((running + waiting) / (per_replica + target_q)))

    rec_t, why_t, overload_t = 0, "", False
    ttft = signals.ttft_p95_seconds
    if ttft is not None and math.isfinite(ttft) and ready > 0:
        ratio = ttft / config.target_ttft_p95_seconds
        settled = (replicas.pending == 0 and hist.ready_changed_at is not None
                   and now - hist.ready_changed_at >= config.metric_window_seconds
                   and not overloaded_in_window(hist, config))
        if ratio > 1 + tol and settled:
            rec_t = max(ready + 1, math.ceil(ready * min(ratio, config.max_ttft_scale_up_ratio)))
            overload_t = True
        elif ratio > 1 + tol:
            rec_t, overload_t = ready, True  # no evidence for more, nor for fewer
        elif 1 - tol <= ratio <= 1 + tol:
            rec_t = ready
        why_t = f"TTFT P95 {ttft:.3f}s (target {config.target_ttft_p95_seconds:g}s)"

    rec_d, why_d, overload_d = _decode_pressure(signals, replicas, config)
    if rec_d > max(rec_q, rec_t):
        return rec_d, why_d, overload_d, None
    if rec_t > rec_q:
        return rec_t, why_t, overload_t, None
    return rec_q, why_q + (f", {why_t}" if why_t else "") + (f", {why_d}" if why_d else ""), \
        overload_q or overload_t, arrivals_q


# A decode pool's own pressure (spec.disaggregation.decode.autoscaling; a colocated fleet has no such target): the
# KV cache in use (mean over its replicas) and the inter-token latency P95, each against its target; the worse
# ratio speaks. Above the band: the ready count times it (at most max_ttft_scale_up_ratio, at least +1), made under
# overload (it holds scale-down for one metric window: the KV in use then is the running streams', which finish);
# inside: the ready count; below: no objection. Nothing ready: no objection (the queue rule wakes the pool).
def _decode_pressure(signals: Signals, replicas: ReplicaCounts, config: PolicyConfig) -> tuple[int, str, bool]:
    ratios = []
    if config.target_kv_cache_usage is not None and signals.kv_cache_usage is not None:
        ratios.append((signals.kv_cache_usage / config.target_kv_cache_usage,
                       f"KV cache {signals.kv_cache_usage:.0%} in use (target {config.target_kv_cache_usage:.0%})"))
    itl = signals.itl_p95_seconds
    if config.target_itl_p95_seconds is not None and itl is not None and math.isfinite(itl):
        ratios.append((itl / config.target_itl_p95_seconds,
                       f"ITL P95 {itl:.3f}s (target {config.target_itl_p95_seconds:g}s)"))
    ready, tol = replicas.ready, config.tolerance
    if not ratios or ready == 0:
        return 0, "", False
    ratio, why = max(ratios)
    if ratio > 1 + tol:
        return max(ready + 1, math.ceil(ready * min(ratio, config.max_ttft_scale_up_ratio))), why, True
    return (ready if ratio >= 1 - tol else 0), why, False


def _floor(config: PolicyConfig, current: int, idle: bool) -> int:
    if config.min_replicas > 0:
        return config.min_replicas
    return 0 if idle or current == 0 else 1


def _in_force(config: PolicyConfig, overload: int) -> float:
    """How long a recommendation holds scale-down: the window, or one metric window for an overload one."""
    if overload:
        return min(config.metric_window_seconds, config.scale_down_stabilization_seconds)
    return config.scale_down_stabilization_seconds


# Recommendations are kept as runs of equal values (`ScaleHistory.recommendations`), so a steady service's
# history does not change from pass to pass and its status is not rewritten. The windows ask only whether a
# value was made within them, which a run's last pass answers exactly as the pass-by-pass list did. A run
# ends at the last pass that made it (`recommended_until`); read back from status that pass is unknown, and
# the caller gives the latest time it can have been (`history_status.history_for`), else the run is taken to
# have held until this pass: a restarted operator keeps a recommendation in force no shorter than an
# uninterrupted one would. Runs that left the longest window go when a new run starts.
def _record(hist: ScaleHistory, rec: int, overload: bool, now: float, config: PolicyConfig) -> ScaleHistory:
    runs, made = hist.recommendations, (rec, int(overload))
    if runs and runs[-1][1:] == made:
        return replace(hist, recommended_until=now)
    keep = max(config.scale_up_stabilization_seconds, config.scale_down_stabilization_seconds)
    if runs:
        until = now if hist.recommended_until is None else hist.recommended_until
        runs = tuple(r for r in runs[:-1] if r[0] >= now - keep) + ((until, *runs[-1][1:]),)
    return replace(hist, recommendations=runs + ((now, *made),), recommended_until=now)


def _finish(current: int, desired: int, reason: str, message: str, hist: ScaleHistory, rec: int | None,
            now: float) -> ScaleDecision:
    if desired != current:
        hist = hist.with_event(ScaleEvent(now, current, desired, reason))
        log.info("autoscale %s: %d -> %d (%s)", reason, current, desired, message)
    return ScaleDecision(desired_replicas=desired, reason=reason, message=message, history=hist,
                         recommendation=rec)
