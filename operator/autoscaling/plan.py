"""The pure part of the autoscaler's pass over one InferenceService: from the stored object, its pods and the
signals, everything the pass writes (a `Plan`: the decision, status fields, Events). The I/O around it and the
pass's policy are in `autoscaler`; the pools of spec.disaggregation are planned each like this (`pool_pass`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubeinfer.operator.autoscaling.history_status import RememberedHistory, history_for, history_status
from kubeinfer.operator.autoscaling.policies.predictive_pass import decide_predictive
from kubeinfer.operator.autoscaling.policies.reactive import METRICS_STALE, METRICS_UNAVAILABLE, decide
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleDecision
from kubeinfer.operator.autoscaling.signals.cold_start import ColdStartRecord
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.pods import replica_counts
from kubeinfer.operator.events import EventSpec, condition_events
from kubeinfer.operator.reconcile import status as status_mod
from kubeinfer.operator.spec import METRICS_AVAILABLE, SCALING_ACTIVE, InferenceServiceSpec
from kubeinfer.operator.times import rfc3339

MANUAL_SCALE_OVERRIDDEN = "ManualScaleOverridden"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one pass writes. `replicas` is None when spec.replicas already holds the decision."""

    decision: ScaleDecision
    current: int  # the count the policy decided from
    replicas: int | None
    status: dict[str, Any]
    events: tuple[EventSpec, ...]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def scaling_conditions(signals: Signals, decision: ScaleDecision) -> list[dict[str, Any]]:
    def cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}

    holding = decision.reason in (METRICS_UNAVAILABLE, METRICS_STALE)
    if holding:
        metrics = cond(METRICS_AVAILABLE, False, decision.reason, decision.message)
    else:
        metrics = cond(METRICS_AVAILABLE, True, "SignalsRead",
                       f"queue {signals.queue_depth:g}, running {signals.num_running or 0:g}, "
                       f"TTFT P95 {'n/a' if signals.ttft_p95_seconds is None else f'{signals.ttft_p95_seconds:.3f}s'}")
    scaling = cond(SCALING_ACTIVE, not holding, decision.reason, decision.message)
    return [scaling, metrics]


def _last_signals(signals: Signals, decision: ScaleDecision) -> dict[str, Any]:
    """status.lastSignals: the values, rounded, without their time (a time would rewrite status every pass; the
    null removes the one an older operator wrote)."""
    values = {k: (_round(v) if isinstance(v, float) else v) for k, v in signals.to_dict().items()}
    return {**values, "timestamp": None, "recommendation": decision.recommendation, "reason": decision.reason}


def plan_pass(body: dict[str, Any], spec: InferenceServiceSpec, signals: Signals, pods: list[dict[str, Any]],
              now: float, remembered: RememberedHistory | None = None, previous_pass: float | None = None) -> Plan:
    """The decision for one pass and every write it implies; pure. `remembered`: what the previous pass of this
    process decided from and wrote (None: decide from status alone, as a restarted operator does);
    `previous_pass`: the latest time the previous pass can have been (None: unknown)."""
    assert spec.autoscaling is not None
    st = body.get("status") or {}
    cold_start = ColdStartRecord.from_status(st).with_pods(pods)
    config = PolicyConfig.from_spec(spec.autoscaling, learned_cold_start_seconds=cold_start.seconds,
                                    max_num_seqs=spec.runtime.max_num_seqs,
                                    max_num_batched_tokens=spec.runtime.max_num_batched_tokens)
    last = st.get("desiredReplicas") if st.get("scalingHistory") else None   # its own decision, or none yet
    manual = spec.replicas is not None and last is not None and spec.replicas != last
    current = last if manual else spec.desired_replicas
    counts = replica_counts(current, pods, config.initial_delay_seconds, now)
    history = history_for(st.get("scalingHistory"), remembered, previous_pass)
    decision = decide(signals, counts, history, config, now)
    predictive = None
    if spec.autoscaling.policy == "predictive":
        outcome = decide_predictive(decision, history, signals, counts, st.get("predictive"), config, now)
        decision, predictive = outcome.decision, outcome.status
    desired = decision.desired_replicas

    events: list[EventSpec] = []
    if manual:
        events.append(EventSpec("Normal", MANUAL_SCALE_OVERRIDDEN,
                                f"spec.replicas was set to {spec.replicas} while autoscaling is on; the autoscaler "
                                f"owns it and set it to {desired} ({decision.reason}: {decision.message})"))
    if desired != current:
        events.append(EventSpec("Normal", decision.reason, f"{current} -> {desired} replicas: {decision.message}"))
    conditions = status_mod.merge_conditions(st.get("conditions") or [], scaling_conditions(signals, decision),
                                             rfc3339(now), (body.get("metadata") or {}).get("generation"))
    events += condition_events(st.get("conditions") or [], conditions)

    available = decision.reason not in (METRICS_UNAVAILABLE, METRICS_STALE)
    status: dict[str, Any] = {
        "desiredReplicas": desired,
        "queueDepth": _round(signals.queue_depth) if available else None,
        "ttftP95Seconds": _round(signals.ttft_p95_seconds) if available else None,
        "lastSignals": _last_signals(signals, decision),
        "scalingHistory": history_status(decision.history, st.get("scalingHistory"), now),
        "conditions": conditions,
    }
    if predictive is not None:
        status["predictive"] = predictive
    if decision.history.last_scale_time is not None:
        status["lastScaleTime"] = rfc3339(decision.history.last_scale_time)
    if cold_start.samples:
        status.update(cold_start.to_status())
    return Plan(decision=decision, current=current, replicas=desired if spec.replicas != desired else None,
                status=status, events=tuple(events))
