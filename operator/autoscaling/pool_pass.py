"""The autoscaler's pass over an InferenceService with spec.disaggregation: each pool planned as a colocated fleet
is (`plan.plan_pass`, on its own signals, history and bounds), then the two decisions bound together.

Policy, decided here (docs/disaggregation.md, "Autoscaling the pools"):
- Each pool's state lives under `status.disaggregation.<pool>` (desiredReplicas, scalingHistory, lastSignals, ...:
  the fields a colocated fleet's autoscaler keeps at the top of status), and its decision is written to
  `spec.disaggregation.<pool>.replicas`, both pools in one merge patch, after the status (as `autoscaler` does).
- Zero together, wake together: when one pool's decision is 0 and the other's is not, neither goes to zero (the one
  deciding 0 keeps 1), so a pool reaches zero only with the other, and a pool that wakes wakes the other. So the
  decode pool is never at zero while the prefill pool is not (a CEL rule refuses it). Requests waiting at the
  router count in both pools' queues (`pool_signals`), so both wake on the first one anyway.
- The conditions ScalingActive and MetricsAvailable are the service's: False when either pool's is, each message
  naming its pool. Every change of replicas is an Event naming its pool.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from kubeinfer.operator.autoscaling.history_status import RememberedHistory
from kubeinfer.operator.autoscaling.plan import MANUAL_SCALE_OVERRIDDEN, Plan, plan_pass, scaling_conditions
from kubeinfer.operator.autoscaling.policies.reactive import SCALE_FROM_ZERO
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.pool_signals import PoolReaders, pool_signals
from kubeinfer.operator.autoscaling.signals.prometheus_fleet import FleetSignals
from kubeinfer.operator.autoscaling.signals.readers import SharedReaders
from kubeinfer.operator.events import EventSpec, condition_events
from kubeinfer.operator.kube import FIELD_MANAGER, MERGE_PATCH
from kubeinfer.operator.reconcile import builders, pools, status as status_mod
from kubeinfer.operator.reconcile.controller import Context
from kubeinfer.operator.spec import METRICS_AVAILABLE, POOLS, SCALING_ACTIVE, InferenceServiceSpec
from kubeinfer.operator.times import rfc3339, rfc3339_precise

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolsPlan:
    """Everything one pass writes: each pool's plan (its decision before binding), the bound sizes, and the
    status and spec patches (None: nothing to write to the spec)."""

    plans: dict[str, Plan]
    desired: dict[str, int]
    status: dict[str, Any]
    replicas_patch: dict[str, Any] | None
    events: tuple[EventSpec, ...]


def autoscaled(spec: InferenceServiceSpec) -> bool:
    return spec.disaggregation is not None and spec.disaggregation.autoscaled


def together(desired: dict[str, int]) -> dict[str, int]:
    """Both pools at zero, or neither: a pool deciding 0 beside one that does not keeps 1."""
    if all(n == 0 for n in desired.values()):
        return dict(desired)
    return {role: max(n, 1) for role, n in desired.items()}


def _service_conditions(per_pool: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    combined = []
    for type_ in (SCALING_ACTIVE, METRICS_AVAILABLE):
        conds = {role: next(c for c in per_pool[role] if c["type"] == type_) for role in ("decode", "prefill")}
        failing = [role for role, c in conds.items() if c["status"] == "False"]
        speaking = failing[0] if failing else "decode"
        combined.append({"type": type_, "status": "False" if failing else "True",
                         "reason": conds[speaking]["reason"],
                         "message": "; ".join(f"{role} pool: {c['message']}" for role, c in conds.items())})
    return combined


def plan_pools(body: dict[str, Any], spec: InferenceServiceSpec, signals: dict[str, Signals],
               pods: list[dict[str, Any]], now: float, remembered: dict[str, RememberedHistory],
               previous_pass: float | None = None) -> PoolsPlan:
    """Both pools' decisions for one pass and every write they imply; pure."""
    assert spec.disaggregation is not None and spec.disaggregation.autoscaled
    st = body.get("status") or {}
    kept = st.get("disaggregation") or {}
    plans, per_pool = {}, {}
    for role in POOLS:
        pool = spec.disaggregation.pool(role)
        view_spec = spec.model_copy(update={"autoscaling": pool.autoscaling, "replicas": pool.replicas,
                                            "disaggregation": None})
        view_body = {"metadata": body.get("metadata") or {}, "status": {**(kept.get(role) or {}), "conditions": []}}
        plans[role] = plan_pass(view_body, view_spec, signals[role], pools.pods_of(pods, role), now,
                                remembered.get(role), previous_pass)
        per_pool[role] = scaling_conditions(signals[role], plans[role].decision)
    desired = together({role: plan.decision.desired_replicas for role, plan in plans.items()})

    events: list[EventSpec] = []
    pool_status, patch = {}, {}
    for role, plan in plans.items():
        d, asked = plan.decision, spec.disaggregation.pool(role).replicas
        why = d.message if desired[role] == d.desired_replicas else \
            f"{d.message}; {desired[role]} instead: the pools are at zero together or not at all"
        if asked is not None and plan.current != asked:
            events.append(EventSpec("Normal", MANUAL_SCALE_OVERRIDDEN,
                                    f"disaggregation.{role}.replicas was set to {asked} while autoscaling is on; the "
                                    f"autoscaler owns it and set it to {desired[role]} ({d.reason}: {why})"))
        if desired[role] != plan.current:
            reason = SCALE_FROM_ZERO if plan.current == 0 else d.reason   # woken with the other pool, or by itself
            events.append(EventSpec("Normal", reason, f"{role} pool: {plan.current} -> {desired[role]} replicas: "
                                                      f"{why}"))
        pool_status[role] = {**{k: v for k, v in plan.status.items() if k != "conditions"},
                             "desiredReplicas": desired[role]}
        if asked != desired[role]:
            patch[role] = {"replicas": desired[role]}
    conditions = status_mod.merge_conditions(st.get("conditions") or [], _service_conditions(per_pool), rfc3339(now),
                                             (body.get("metadata") or {}).get("generation"))
    events += condition_events(st.get("conditions") or [], conditions)
    status = {"disaggregation": {role: {**(kept.get(role) or {}), **pool_status[role]} for role in POOLS},
              "conditions": conditions}
    return PoolsPlan(plans=plans, desired=desired, status=status,
                     replicas_patch={"spec": {"disaggregation": patch}} if patch else None, events=tuple(events))


class PoolScaler(Protocol):
    """What a pass over the pools uses of its `autoscaler.Autoscaler` (which imports this module)."""
    ctx: Context
    namespace: str
    name: str
    path: str
    readers: SharedReaders
    prometheus: FleetSignals | None   # None: scrape the pods
    pool_readers: PoolReaders | None
    pool_remembered: dict[str, RememberedHistory]
    clock: Callable[[], float]

    def read(self) -> tuple[dict[str, Any] | None, InferenceServiceSpec | None, list[dict[str, Any]]]: ...

    async def router_waiting(self, body: dict[str, Any], url: str | None) -> float | None: ...


async def step(scaler: PoolScaler, body: dict[str, Any], spec: InferenceServiceSpec,
               pods: list[dict[str, Any]]) -> PoolsPlan | None:
    """One pass of `scaler` (an `autoscaler.Autoscaler`) over a service with spec.disaggregation."""
    assert spec.disaggregation is not None
    readers = scaler.pool_readers
    if readers is None:
        readers = scaler.pool_readers = PoolReaders(client=scaler.readers.scrape_client)
    served = builders.served_name(spec, builders.Owner.from_body(body))
    url = spec.disaggregation.decode.autoscaling.router_metrics_url
    waiting = await scaler.router_waiting(body, url)
    signals = await pool_signals(scaler.prometheus, readers, spec, scaler.namespace, scaler.name, served, pods,
                                 waiting)
    return await asyncio.to_thread(_decide_and_write, scaler, signals)


def _decide_and_write(scaler: PoolScaler, signals: dict[str, Signals]) -> PoolsPlan | None:
    with scaler.ctx.lock_for(scaler.namespace, scaler.name):   # reconcile merges the same conditions list
        body, spec, pods = scaler.read()
        if body is None or spec is None or not autoscaled(spec):
            return None
        now = scaler.clock()
        plan = plan_pools(body, spec, signals, pods, now, scaler.pool_remembered,
                          now - scaler.ctx.config.autoscale_interval_seconds)
        patch = status_mod.status_patch(body.get("status") or {}, plan.status)
        if patch:
            scaler.ctx.kube.patch_status(scaler.path, patch)
        scaler.pool_remembered = {
            role: RememberedHistory(plan.status["disaggregation"][role]["scalingHistory"], p.decision.history)
            for role, p in plan.plans.items()}
        if plan.replicas_patch is not None:
            scaler.ctx.kube.request("PATCH", scaler.path, body=plan.replicas_patch, content_type=MERGE_PATCH,
                                    query={"fieldManager": FIELD_MANAGER})
        scaler.ctx.events.record(scaler.ctx.kube, body, plan.events)
        for role, p in plan.plans.items():
            d = p.decision
            log.info("autoscale %s/%s %s pool: %s %d -> %d (recommended %s) %s; signals of %s", scaler.namespace,
                     scaler.name, role, d.reason, p.current, plan.desired[role], d.recommendation, d.message,
                     rfc3339_precise(signals[role].timestamp))
        return plan
