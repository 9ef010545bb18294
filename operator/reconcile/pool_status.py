"""The status of an InferenceService with `spec.disaggregation`: each pool observed as a colocated fleet is
(reconcile.status), then the two put together.

Policy, decided here:
- `status.disaggregation.prefill` / `.decode`: the pool's replicas, readyReplicas, updatedReplicas and
  desiredReplicas (the pool's size in the spec, which the autoscaler owns when it is on). The autoscaler's own
  fields for the pool sit beside them and are kept. The top-level replicas, readyReplicas, updatedReplicas and
  desiredReplicas are the sums of both pools (`kubectl get` shows them).
- Ready follows the decode pool: it is the one that answers (with no prefill replica up the router serves
  requests colocated there). A decode pool that serves while the prefill pool, asked for replicas, has none
  ready is Ready=True with reason `PrefillNotReady`, so `kubectl get`'s STATUS says it.
- Progressing and Degraded are True when either pool's is; every message names the pool it is about
  ("decode pool: 1/2 replicas ready; ..."), the reason is the decode pool's first, or the most actionable one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubeinfer.operator.reconcile import status as status_mod
from kubeinfer.operator.spec import DEGRADED, POOLS, PROGRESSING, READY

PREFILL_NOT_READY = "PrefillNotReady"


@dataclasses.dataclass(frozen=True)
class PoolObservation:
    """One pool as the pass saw it: its size in the spec, its Deployment, its pods."""

    desired: int
    deployment: dict[str, Any] | None
    pods: list[dict[str, Any]]

    def counts(self) -> dict[str, int]:
        dep = (self.deployment or {}).get("status") or {}
        return {"replicas": dep.get("replicas") or 0, "readyReplicas": dep.get("readyReplicas") or 0,
                "updatedReplicas": dep.get("updatedReplicas") or 0, "desiredReplicas": self.desired}


def _named(role: str, cond: dict[str, Any]) -> str:
    return f"{role} pool: {cond['message']}"


def _cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}


def combined_conditions(per_pool: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Ready, Progressing and Degraded of the service from each pool's (reconcile.status.conditions_for)."""
    order = ("decode", "prefill")   # the pool that answers first
    by_type = {role: {c["type"]: c for c in per_pool[role]} for role in order}
    both = "; ".join(_named(role, by_type[role][READY]) for role in order)
    decode_ready, prefill_ready = by_type["decode"][READY], by_type["prefill"][READY]
    if decode_ready["status"] == "True" and prefill_ready["status"] == "False" and \
            prefill_ready["reason"] != "ScaledToZero":
        ready = _cond(READY, True, PREFILL_NOT_READY,
                      f"{both} (requests are served colocated on the decode pool meanwhile)")
    else:
        ready = _cond(READY, decode_ready["status"] == "True", decode_ready["reason"], both)

    moving = [role for role in order if by_type[role][PROGRESSING]["status"] == "True"]
    if moving:
        progressing = _cond(PROGRESSING, True, by_type[moving[0]][PROGRESSING]["reason"],
                            "; ".join(_named(role, by_type[role][PROGRESSING]) for role in moving))
    else:
        progressing = _cond(PROGRESSING, False, "Complete",
                            "; ".join(_named(role, by_type[role][PROGRESSING]) for role in order))

    failing = [role for role in order if by_type[role][DEGRADED]["status"] == "True"]
    if failing:
        rank = lambda role: status_mod.REASON_ORDER.index(r) if (r := by_type[role][DEGRADED]["reason"]) \
            in status_mod.REASON_ORDER else 99  # noqa: E731
        worst = min(failing, key=rank)
        degraded = _cond(DEGRADED, True, by_type[worst][DEGRADED]["reason"],
                         "; ".join(_named(role, by_type[role][DEGRADED]) for role in sorted(failing, key=rank)))
    else:
        degraded = _cond(DEGRADED, False, "AsExpected", "no problems observed")
    return [ready, progressing, degraded]


def compute_status(
        *, pools: dict[str, PoolObservation], selector: str, endpoint: str, generation: int | None,
        current: dict[str, Any], now: str, autoscaled: bool,
) -> dict[str, Any]:
    """The operator-owned status fields for one observation of both pools (the shape of
    reconcile.status.compute_status's, plus `disaggregation`)."""
    per_pool = {role: status_mod.conditions_for(obs.desired, obs.deployment,
                                                status_mod.pod_problems(obs.pods), [])
                for role, obs in pools.items()}
    counts = {role: pools[role].counts() for role in POOLS}
    kept = current.get("disaggregation") or {}
    total = {key: sum(c[key] for c in counts.values()) for key in ("replicas", "readyReplicas", "updatedReplicas")}
    status: dict[str, Any] = {
        **total,
        "selector": selector,
        "endpoint": endpoint,
        "conditions": status_mod.merge_conditions(current.get("conditions") or [], combined_conditions(per_pool),
                                                  now, generation),
        "disaggregation": {role: _pool_status(kept.get(role) or {}, counts[role], autoscaled) for role in POOLS},
        # DESIRED is never blank; with autoscaling each pool's desiredReplicas is its spec, which the autoscaler
        # writes right after its decision.
        "desiredReplicas": sum(c["desiredReplicas"] for c in counts.values()),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if current.get("scalingHistory") is not None:   # a colocated autoscaler's, from before
        status["scalingHistory"] = None
    return status


def _pool_status(current: dict[str, Any], counts: dict[str, int], autoscaled: bool) -> dict[str, Any]:
    """A pool's status: its counts; the autoscaler's fields kept while it is on, removed (merge patch nulls)
    once it is off, so that turning it on again starts from the spec."""
    kept = current if autoscaled else {key: None for key in current}
    return {**kept, **counts}
