"""Pure computation of an InferenceService's status from its Deployment and pods.

Conditions (constant types, CamelCase reasons), as kubebuilder's SetStatusCondition does them:
- Ready: True while at least one replica serves requests (the Service has an endpoint).
  Progressing tells whether the rest of the desired replicas are still coming.
- Progressing: True while the Deployment rolls out, scales, or waits for replicas to load.
- Degraded: True when something needs a person: bad spec, image pull failures, crash loops,
  pods that cannot be scheduled (no free GPUs), a rollout past its deadline, a quota refusal.
Ready's reason is what `kubectl get infsvc` shows as STATUS: Available, the blocking problem, or while no
replica is ready yet what is under way (Creating, RollingOut, LoadingModel).
The operator writes only the fields below; other writers' fields and conditions are kept.

`desiredReplicas` is what `kubectl get` shows as DESIRED, so it is never left blank: without autoscaling
it is the replicas the spec asks for (spec.replicas, else 1); with autoscaling it is the autoscaler's last
decision (kubeinfer.operator.autoscaling), which reconcile writes only while there is none yet: the starting size.
Turning autoscaling off also drops the autoscaler's memory (`scalingHistory`), so that turning it on again
starts from the user's spec.replicas rather than from a decision made before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubeinfer.operator.reconcile.lora.status import AdapterReport
from kubeinfer.operator.spec import ADAPTERS_READY, DEGRADED, PROGRESSING, READY

# The autoscaler's conditions (ScalingActive, MetricsAvailable; kubeinfer.operator.spec.status) are not ours:
# merge_conditions keeps them. AdaptersReady is ours with runtime.lora (reconcile.lora.status).
OWN_CONDITIONS = (READY, PROGRESSING, DEGRADED, ADAPTERS_READY)
OWN_FIELDS = ("observedGeneration", "replicas", "readyReplicas", "updatedReplicas", "selector", "endpoint",
              "conditions", "desiredReplicas", "adapters")

IMAGE_PULL_REASONS = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
# Most actionable first: the first problem found names the Degraded reason.
REASON_ORDER = ("InvalidSpec", "ImagePullFailed", "CrashLoop", "ContainerConfigError", "InsufficientGPU",
                "Unschedulable", "ProgressDeadlineExceeded", "ReplicaFailure")
MAX_MESSAGES = 3


@dataclasses.dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def _container_problems(pod_name: str, statuses: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, detail = waiting.get("reason"), waiting.get("message", "")
        where = f"pod {pod_name} container {cs.get('name')}"
        if reason in IMAGE_PULL_REASONS:
            problems.append(Problem("ImagePullFailed", f"{where}: cannot pull image {cs.get('image')}: {detail}".rstrip(": ")))
        elif reason == "CrashLoopBackOff":
            last = ((cs.get("lastState") or {}).get("terminated")) or {}
            exit_info = f"last exit {last.get('reason', 'unknown')} (code {last.get('exitCode', '?')})"
            said = _last_line(last.get("message") or "")
            problems.append(Problem("CrashLoop", f"{where} keeps crashing, {cs.get('restartCount', 0)} restarts, "
                                                 f"{exit_info}" + (f": {said}" if said else "")))
        elif reason in ("CreateContainerConfigError", "CreateContainerError"):
            problems.append(Problem("ContainerConfigError", f"{where}: {detail or reason}"))
    return problems


def _last_line(message: str, limit: int = 300) -> str:
    """The last non-empty line of a container's termination message (its log tail), shortened."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def pod_problems(pods: list[dict[str, Any]]) -> list[Problem]:
    """What keeps pods from running, in words a person can act on."""
    problems: list[Problem] = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                message = cond.get("message", "")
                reason = "InsufficientGPU" if "nvidia.com/gpu" in message else "Unschedulable"
                problems.append(Problem(reason, f"pod {name} cannot be scheduled: {message}"))
        problems += _container_problems(name, status.get("initContainerStatuses") or [])
        problems += _container_problems(name, status.get("containerStatuses") or [])
    return problems


def deployment_problems(deployment: dict[str, Any] | None) -> list[Problem]:
    problems = []
    for cond in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            problems.append(Problem("ProgressDeadlineExceeded", cond.get("message", "rollout past its deadline")))
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            problems.append(Problem("ReplicaFailure", cond.get("message", "pods cannot be created")))
    return problems


def _summarise(problems: list[Problem]) -> Problem:
    ranked = sorted(problems, key=lambda p: REASON_ORDER.index(p.reason) if p.reason in REASON_ORDER else 99)
    messages = list(dict.fromkeys(p.message for p in ranked))
    more = f" (and {len(messages) - MAX_MESSAGES} more)" if len(messages) > MAX_MESSAGES else ""
    return Problem(ranked[0].reason, "; ".join(messages[:MAX_MESSAGES]) + more)


def _cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}


def conditions_for(
        desired: int, deployment: dict[str, Any] | None, problems: list[Problem], spec_errors: list[str],
) -> list[dict[str, Any]]:
    """Ready, Progressing and Degraded for one observation (without timestamps)."""
    if spec_errors:
        message = "; ".join(spec_errors)
        return [_cond(READY, False, "InvalidSpec", message), _cond(PROGRESSING, False, "InvalidSpec", message),
                _cond(DEGRADED, True, "InvalidSpec", message)]
    problems = problems + deployment_problems(deployment)
    worst = _summarise(problems) if problems else None
    dep_status = (deployment or {}).get("status") or {}
    ready = dep_status.get("readyReplicas") or 0
    updated = dep_status.get("updatedReplicas") or 0
    current = dep_status.get("replicas") or 0
    counts = f"{ready}/{desired} replicas ready"

    if deployment is None:
        progressing = _cond(PROGRESSING, True, "Creating", "creating the Deployment")
    elif worst is not None and ready < desired:
        progressing = _cond(PROGRESSING, True, worst.reason, worst.message)
    elif updated < desired:
        progressing = _cond(PROGRESSING, True, "RollingOut", f"{updated}/{desired} replicas updated, {counts}")
    elif ready < desired:
        progressing = _cond(PROGRESSING, True, "LoadingModel", f"{counts}; the rest are starting or loading the model")
    elif current > desired:
        progressing = _cond(PROGRESSING, True, "ScalingDown", f"{current} replicas running, {desired} desired")
    else:
        progressing = _cond(PROGRESSING, False, "Complete", counts)

    if desired == 0:
        ready_cond = _cond(READY, False, "ScaledToZero", "no replicas are desired")
    elif ready > 0:
        ready_cond = _cond(READY, True, "Available", counts)
    elif worst is not None:
        ready_cond = _cond(READY, False, worst.reason, worst.message)
    elif progressing["status"] == "True":   # nothing wrong: say what is under way
        ready_cond = _cond(READY, False, progressing["reason"], progressing["message"])
    else:
        ready_cond = _cond(READY, False, "NoReplicasReady", counts)

    degraded = _cond(DEGRADED, True, worst.reason, worst.message) if worst else \
        _cond(DEGRADED, False, "AsExpected", "no problems observed")
    return [ready_cond, progressing, degraded]


def merge_conditions(
        existing: list[dict[str, Any]], updates: list[dict[str, Any]], now: str, generation: int | None,
) -> list[dict[str, Any]]:
    """Set each updated condition, keeping lastTransitionTime unless its status flips; keep the others."""
    by_type = {c.get("type"): c for c in existing}
    merged = [c for c in existing if c.get("type") not in {u["type"] for u in updates}]
    for update in updates:
        old = by_type.get(update["type"])
        since = old.get("lastTransitionTime") if old and old.get("status") == update["status"] else None
        cond = {**update, "lastTransitionTime": since or now}
        if generation is not None:
            cond["observedGeneration"] = generation
        merged.append(cond)
    order = {t: i for i, t in enumerate(OWN_CONDITIONS)}
    return sorted(merged, key=lambda c: order.get(c.get("type"), len(order)))


def compute_status(
        *, desired: int, selector: str, endpoint: str, generation: int | None,
        deployment: dict[str, Any] | None, pods: list[dict[str, Any]], spec_errors: list[str],
        current: dict[str, Any], now: str, autoscaled: bool | None = False, adapters: AdapterReport | None = None,
) -> dict[str, Any]:
    """The operator-owned status fields for one observation. `autoscaled`: whether the spec has autoscaling
    (None when the spec could not be parsed: the autoscaler's fields are then left as they are). `adapters`: the
    adapter step's report (None: the spec could not be parsed, so its fields are left as they are)."""
    dep_status = (deployment or {}).get("status") or {}
    existing = current.get("conditions") or []
    updates = conditions_for(desired, deployment, pod_problems(pods), spec_errors)
    if adapters is not None and adapters.condition is not None:
        updates.append(adapters.condition)
    elif adapters is not None:   # LoRA off: its condition goes
        existing = [c for c in existing if c.get("type") != ADAPTERS_READY]
    status: dict[str, Any] = {
        "replicas": dep_status.get("replicas") or 0,
        "readyReplicas": dep_status.get("readyReplicas") or 0,
        "updatedReplicas": dep_status.get("updatedReplicas") or 0,
        "selector": selector,
        "endpoint": endpoint,
        "conditions": merge_conditions(existing, updates, now, generation),
    }
    if adapters is not None:
        status["adapters"] = adapters.entries   # None: a merge patch's null removes it (written only if present)
    if generation is not None:
        status["observedGeneration"] = generation
    if autoscaled is False or current.get("desiredReplicas") is None:
        status["desiredReplicas"] = desired
    if autoscaled is False and current.get("scalingHistory") is not None:
        status["scalingHistory"] = None   # a merge patch's null: removed
    return status


def status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``desired`` that differ from ``current``; empty means write nothing. A null member of a
    desired object is equal to a missing one: the merge patch that wrote it removed it."""
    return {key: value for key, value in desired.items()
            if merge_patched(current.get(key)) != merge_patched(value)}


def merge_patched(value: Any) -> Any:
    """`value` as a merge patch leaves it in the object: null members of objects removed, at every depth of
    nested objects (RFC 7386; a list is stored as given). The patch itself keeps its nulls: they remove what
    the object held."""
    if isinstance(value, dict):
        return {k: merge_patched(v) for k, v in value.items() if v is not None}
    return value
