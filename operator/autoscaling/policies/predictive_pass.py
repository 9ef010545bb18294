"""The predictive policy inside the operator's pass (`spec.autoscaling.policy: predictive`). Pure.

The reactive policy (`policy.decide`) still runs first on every pass. It keeps the history the predictive one
reads: the queue samples that give the arrival rate, and the saturated throughput it learns per replica. It also
owns the cases where a forecast has nothing to add: metrics missing or stale (hold: never scale down blind), the
floor and the ceiling, scale to zero after idling and from zero on a waiting request. Everywhere else the
forecaster (`forecast.py`) takes the arrival rate, and `predictive.decide` sizes the fleet one learned cold start
ahead. The arrival rate is the metric window's, or the last seconds' where those show a significant rise
(`recent_arrivals`): scale-up follows a burst within a tick or two, scale-down the window. The sizing is the
replica model calibrated from the service's own metrics (`calibration`, `calibrated_sizing`: the fleet a steady
rate needs within the TTFT target) once the calibration has enough data; until then `StaffedSizing` over the
learned throughput per replica. Its state is kept in `status.predictive` (forecaster, calibration, the replica
model in use), so a restarted operator resumes the same forecast and model; `status.predictive.forecast` says
what it saw and why it decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kubeinfer.operator.autoscaling.policies.observations import arrival_rate, saturation_throughput
from kubeinfer.operator.autoscaling.sizing import calibrated_sizing
from kubeinfer.operator.autoscaling.sizing.calibration import Calibration
from kubeinfer.operator.autoscaling.policies.reactive import (
    ABOVE_MAX, BELOW_MIN, METRICS_STALE, METRICS_UNAVAILABLE, SCALE_FROM_ZERO, SCALE_TO_ZERO,
)
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleDecision, ScaleEvent, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals
from kubeinfer.operator.autoscaling.policies.predictive import (
    PredictiveConfig, PredictiveState, Sizing, StaffedSizing, decide,
)
from kubeinfer.operator.autoscaling.policies.recent_arrivals import arrival_estimate
from kubeinfer.operator.autoscaling.sizing.replica_model import ReplicaModel

REACTIVE_OWNS = frozenset({METRICS_UNAVAILABLE, METRICS_STALE, ABOVE_MAX, BELOW_MIN, SCALE_FROM_ZERO, SCALE_TO_ZERO})
PREDICTIVE_UP, PREDICTIVE_DOWN, PREDICTIVE_HOLD = "PredictiveScaleUp", "PredictiveScaleDown", "PredictiveHold"
NO_THROUGHPUT = "predictive: no replica model calibrated yet (from the replicas' steps and requests; it waits for "
NO_THROUGHPUT_THEN = ("), and no saturated throughput per replica known (learned once the fleet is busy for a metric "
                      "window; or set autoscaling.throughputPerReplica), so the reactive policy decides: ")


@dataclass(frozen=True)
class PredictiveOutcome:
    decision: ScaleDecision
    status: dict[str, Any]   # status.predictive: the forecaster's state, and what the last pass saw ("forecast")


def _without_own_event(reactive: ScaleDecision, before: ScaleHistory, current: int) -> ScaleHistory:
    """The reactive pass's history without the scale event it recorded: the predictive decision replaces it."""
    history = reactive.history
    if reactive.desired_replicas == current:
        return history
    return replace(history, events=history.events[:-1], last_scale_time=before.last_scale_time,
                   scale_up_sized_for=before.scale_up_sized_for)


def decide_predictive(reactive: ScaleDecision, history_before: ScaleHistory, signals: Signals,
                      counts: ReplicaCounts, stored: dict[str, Any] | None, config: PolicyConfig,
                      now: float) -> PredictiveOutcome:
    """The pass's decision under the predictive policy, from the reactive one (`reactive`, decided from
    `history_before`) and the predictive state kept in status (`stored`)."""
    stored = stored or {}
    state = PredictiveState.from_dict(stored.get("state"))
    window = float(config.metric_window_seconds)
    calibration = Calibration.from_dict(stored.get("calibration")).observe(signals.usage, now, window)
    base = base_model(config)
    fresh = calibrated_sizing.estimate(calibration, base, config.target_ttft_p95_seconds)
    model = calibrated_sizing.in_use(fresh, stored.get("replicaModel"))
    kept = {"state": state.to_dict(), "forecast": stored.get("forecast"), "calibration": calibration.to_dict(),
            "replicaModel": model}
    if model is None:   # what the calibration still lacks (fresh is None exactly then)
        kept["calibrationWaitsFor"] = calibration.waiting_for()
    if reactive.reason in REACTIVE_OWNS:
        return PredictiveOutcome(reactive, kept)
    sizing: Sizing | None = None
    if model is not None:
        sizing = calibrated_sizing.sizing(model, base, config.target_ttft_p95_seconds, config.max_replicas,
                                          config.target_itl_p95_seconds)
    per_replica = saturation_throughput(reactive.history, config)
    if sizing is None and per_replica:
        sizing = StaffedSizing(per_replica, config.headroom)
    if sizing is None:
        message = NO_THROUGHPUT + kept["calibrationWaitsFor"] + NO_THROUGHPUT_THEN + reactive.message
        return PredictiveOutcome(replace(reactive, message=message), kept)

    current = counts.current
    window_rate = arrival_rate(reactive.history, signals)
    rate, recent = arrival_estimate(reactive.history, signals, window_rate)
    cold_start = config.learned_cold_start_seconds or float(config.initial_delay_seconds)
    predictive = PredictiveConfig(config.min_replicas, config.max_replicas,
                                  max_scale_down_step=config.max_scale_down_step)
    d = decide(rate, signals.queue_depth, current, state, predictive, cold_start, now, sizing, window, recent)
    desired = d.desired_replicas
    reason = PREDICTIVE_UP if desired > current else PREDICTIVE_DOWN if desired < current else PREDICTIVE_HOLD
    history = _without_own_event(reactive, history_before, current)
    if desired != current:
        history = history.with_event(ScaleEvent(now, current, desired, reason))
    decision = ScaleDecision(desired, reason, d.reason, history, recommendation=desired)
    seen = _seen(rate, recent, d, cold_start, window, sizing, predictive, config)
    return PredictiveOutcome(decision, {**kept, "state": d.state.to_dict(), "forecast": seen})


def base_model(config: PolicyConfig) -> ReplicaModel:
    """The replica model before calibration: the batch cap and prefill budget of the spec's runtime."""
    base = ReplicaModel()
    return replace(base, max_batch=config.max_num_seqs or base.max_batch,
                   prefill_token_budget=config.max_num_batched_tokens or base.prefill_token_budget)


def _model_sizing(sizing: Any, config: PolicyConfig) -> str:
    """status.predictive.forecast.sizing for the calibrated model's sizing."""
    said = f"calibrated replica model, {100 * sizing.share:.1f}% within target"
    target = config.target_itl_p95_seconds
    if target is None:
        return said
    if sizing.itl_target_s is not None:
        return said + f", 95% of tokens within the ITL target {target:g} s"
    step = sizing.model.step_seconds(1, 0)
    return said + (f"; the ITL target {target:g} s is below a step of one sequence ({step:.3g} s on the calibrated "
                   f"model): no fleet holds it, sized on the TTFT target alone")


def _seen(rate: float, recent: bool, d, cold_start: float, window: float, sizing: Sizing,
          predictive: PredictiveConfig, config: PolicyConfig) -> dict[str, Any]:
    """status.predictive.forecast: what the pass saw and why it decided."""
    forecast = d.state.forecast
    high = forecast.high(cold_start, predictive.k_spread, math.sqrt(max(forecast.level, 0.0) / window))
    return {"arrivalRate": round(rate, 4), "arrivalRateFrom": "recent" if recent else "window", "rate": round(forecast.level, 4),
            "trendPerMinute": round(forecast.trend * 60, 4), "high": round(high, 4),
            "horizonSeconds": round(cold_start, 1), "replicasNeeded": sizing.replicas_for(high),
            **({"ratePerReplica": round(sizing.rate_per_replica, 4)} if isinstance(sizing, StaffedSizing)
               else {"sizing": _model_sizing(sizing, config)}),
            "reason": d.reason}
