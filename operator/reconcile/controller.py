"""One reconcile pass of one InferenceService: parse, build, apply, observe, write status once.

Called by every handler (create/update/resume of the InferenceService, and events of its children),
so a child edited or deleted by hand, or a pod that changes state, leads to the same pass.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.events import EventRecorder, condition_events
from kubeinfer.operator.kube import Kube, resource_path
from kubeinfer.operator.reconcile import builders, inference_pool, model_pool_status, pod, pool_status, pools, router
from kubeinfer.operator.reconcile import status
from kubeinfer.operator.reconcile.apply import delete_owned, ensure
from kubeinfer.operator.reconcile.child_view import ChildView
from kubeinfer.operator.reconcile.lora import fetch as lora_fetch, status as lora_status, sync as lora_sync
from kubeinfer.operator.reconcile.validation import semantic_errors
from kubeinfer.operator.spec import API_VERSION, KIND, POOLS, InferenceServiceSpec, parse_spec
from kubeinfer.operator.times import rfc3339

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Context:
    """What every pass needs, built once at startup and kept in kopf's memo."""

    kube: Kube
    config: OperatorConfig
    with_service_monitor: bool
    events: EventRecorder = dataclasses.field(default_factory=EventRecorder)
    _locks: dict[tuple[str, str], threading.Lock] = dataclasses.field(default_factory=dict)
    _guard: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    _queued: set[tuple[str, str]] = dataclasses.field(default_factory=set)   # see reconcile_soon
    # Services (namespace, name, uid) whose router is known not to exist: see `_remove_router`.
    _routerless: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    # Services (namespace, name, uid) -> whether disaggregated, for those whose other layout's Deployments are known
    # not to exist: see `_remove_other_layout`.
    _layouts: dict[tuple[str, str, str], bool] = dataclasses.field(default_factory=dict)
    # What passes and events have already shown of each child: an event showing nothing new makes no pass.
    children: ChildView = dataclasses.field(default_factory=ChildView)

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        """One pass at a time per InferenceService (handlers run in a thread pool)."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())


def _validation_messages(error: ValidationError) -> list[str]:
    messages = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        messages.append(f"spec.{where}: {item['msg']}" if where else f"spec: {item['msg']}")
    return messages


def own_pods(kube: Kube, owner: builders.Owner) -> list[dict[str, Any]]:
    """The replicas' pods of one InferenceService (the autoscaler counts and scrapes the same ones)."""
    selector = builders.selector_labels(owner)
    pods = kube.list(resource_path("v1", "Pod", owner.namespace), builders.selector_string(owner))
    # Also filter here: a server (or emulator) that ignores the selector must not mix services up.
    return [p for p in pods if selector.items() <= ((p.get("metadata") or {}).get("labels") or {}).items()]


class InvalidSpec(kopf.PermanentError):
    """A spec a person must fix; already said in the status (Degraded, InvalidSpec) and in an Event."""


def reconcile(ctx: Context, body: dict[str, Any]) -> None:
    """Bring the children in line with the spec and write the status if it changed.

    Raises InvalidSpec (a kopf.PermanentError) for a spec a person must fix, kopf.TemporaryError for API
    failures. A change of conditions is also an Event (operator.events).
    """
    owner = builders.Owner.from_body(body)
    generation = body["metadata"].get("generation")
    spec = None
    pool_unavailable = False
    try:
        spec = parse_spec(body.get("spec") or {})
        errors = semantic_errors(spec, owner.name)
    except ValidationError as e:
        errors = _validation_messages(e)

    try:
        seen: dict[str, dict[str, Any]] = {}   # children as the server answered for them in this pass
        if spec is not None and not errors:
            for child in builders.children(spec, owner, ctx.config, with_service_monitor=ctx.with_service_monitor):
                ensure(ctx.kube, child, seen)
            for child in seen.values():   # their events showing the same (the echo of a write) are no news
                ctx.children.saw(child)
            _remove_other_layout(ctx, owner, disaggregated=spec.disaggregation is not None)
            if spec.router_enabled:
                ctx._routerless.discard((owner.namespace, owner.name, owner.uid))
            for child in router.children(spec, owner, ctx.config):
                ensure(ctx.kube, child)
            if not spec.router_enabled:
                _remove_router(ctx, owner)
            if spec.inference_pool is None:
                inference_pool.remove(ctx.kube, owner)
            elif inference_pool.served(ctx.kube):
                ensure(ctx.kube, inference_pool.inference_pool(spec, owner))
            else:
                pool_unavailable = True
        current = body.get("status") or {}
        if spec is not None and not errors and spec.disaggregation is not None:
            observed = _observe_pools(ctx, spec, owner, generation, current, seen)
        else:
            observed = _observe_colocated(ctx, spec, owner, generation, current, seen, errors)
        patch = status.status_patch(current, observed)
        if patch:
            ctx.kube.patch_status(resource_path(API_VERSION, KIND, owner.namespace, owner.name), patch)
            log.info("status of %s/%s: %s", owner.namespace, owner.name, sorted(patch))
            ctx.events.record(ctx.kube, body, condition_events(current.get("conditions") or [],
                                                               observed["conditions"]))
    except ApiException as e:
        if e.status == 404 and not body["metadata"].get("deletionTimestamp"):
            raise kopf.TemporaryError(f"not found while reconciling: {e.reason}", delay=5) from e
        if e.status == 404:
            return  # the InferenceService is going away; garbage collection takes the children
        if e.status in (400, 403, 422):
            raise kopf.TemporaryError(f"API server refused a write ({e.status} {e.reason}): {e.body}", delay=60) from e
        raise kopf.TemporaryError(f"API error {e.status} {e.reason}", delay=10) from e

    if errors:
        raise InvalidSpec("invalid spec: " + "; ".join(errors))
    if pool_unavailable:
        raise inference_pool.PoolUnavailable()


def _observe_colocated(ctx: Context, spec: InferenceServiceSpec | None, owner: builders.Owner, generation: int | None,
                       current: dict[str, Any], seen: dict[str, dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    """The status of the replicas' Deployment `NAME` and its pods, after telling the router the ready ones."""
    deployment_path = resource_path("apps/v1", "Deployment", owner.namespace, owner.name)
    deployment = seen[deployment_path] if deployment_path in seen else ctx.kube.get(deployment_path)
    pods = own_pods(ctx.kube, owner) if deployment is not None else []
    routed = spec is not None and not errors and spec.router_enabled
    if routed:
        router.sync_endpoints(ctx.kube, owner, pods)
    adapters = None if spec is None or errors else sync_adapters(ctx, spec, owner, pods)
    observed = status.compute_status(
        desired=spec.desired_replicas if spec is not None else 0, selector=builders.selector_string(owner),
        endpoint=router.endpoint(owner) if routed else builders.endpoint(owner),
        generation=generation, deployment=deployment, pods=pods, spec_errors=errors,
        current=current, now=rfc3339(time.time()),
        autoscaled=None if spec is None else spec.autoscaling is not None, adapters=adapters)
    if spec is not None and not errors and current.get("disaggregation") is not None:
        observed["disaggregation"] = None   # turned off: a merge patch's null removes the pools' status
    if spec is not None and not errors and spec.model_pool is not None:
        observed["modelPool"] = model_pool_status.observe(spec, builders.served_name(spec, owner), pod.PORT, pods)
    elif current.get("modelPool") is not None:
        observed["modelPool"] = None
    return observed


def _observe_pools(ctx: Context, spec: InferenceServiceSpec, owner: builders.Owner, generation: int | None,
                   current: dict[str, Any], seen: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The status of both pools of spec.disaggregation, after telling the router each pool's ready replicas (the
    router is always on with it: a CEL rule)."""
    assert spec.disaggregation is not None
    paths = {role: resource_path("apps/v1", "Deployment", owner.namespace, pools.pool_name(owner.name, role))
             for role in POOLS}
    deployments = {role: seen[path] if path in seen else ctx.kube.get(path) for role, path in paths.items()}
    pods = own_pods(ctx.kube, owner) if any(deployments.values()) else []
    router.sync_endpoints(ctx.kube, owner, pools.pods_of(pods, "decode"), pools.pods_of(pods, "prefill"))
    observations = {role: pool_status.PoolObservation(spec.disaggregation.pool(role).desired_replicas,
                                                      deployments[role], pools.pods_of(pods, role))
                    for role in POOLS}
    return pool_status.compute_status(
        pools=observations, selector=builders.selector_string(owner), endpoint=router.endpoint(owner),
        generation=generation, current=current, now=rfc3339(time.time()), autoscaled=spec.disaggregation.autoscaled)


def _remove_other_layout(ctx: Context, owner: builders.Owner, *, disaggregated: bool) -> None:
    """Turning spec.disaggregation on deletes the colocated Deployment `NAME`; turning it off deletes the pools'.
    Looked for once per service, layout and operator process, as `_remove_router` does: only this operator makes
    them, in a pass under the same lock."""
    key = (owner.namespace, owner.name, owner.uid)
    if ctx._layouts.get(key) is disaggregated:
        return
    names = [owner.name] if disaggregated else [pools.pool_name(owner.name, role) for role in POOLS]
    for name in names:
        delete_owned(ctx.kube, owner, "apps/v1", "Deployment", name,
                     "disaggregation turned on" if disaggregated else "disaggregation turned off")
    ctx._layouts[key] = disaggregated


def sync_adapters(ctx: Context, spec: InferenceServiceSpec, owner: builders.Owner,
                  pods: list[dict[str, Any]]) -> lora_status.AdapterReport:
    """What the ready replicas serve of the spec's adapters (reconcile.lora.sync); its report for the status."""
    if spec.runtime.lora is None:
        return lora_status.LORA_OFF
    desired = lora_fetch.desired_paths(spec)
    lora_sync.nudge(ctx.kube, owner.namespace, pods, desired)
    ready = lora_sync.ready_pods(pods)
    outcomes = lora_sync.sync(ready, desired)
    return lora_status.report([a.name for a in spec.adapters], [p["metadata"]["name"] for p in ready], outcomes)


def _remove_router(ctx: Context, owner: builders.Owner) -> None:
    """The router's children go when `spec.router` does. Looked for once per service and operator process: only
    this operator makes them, in a pass under the same lock, which forgets the absence first (a service with
    the router off read 2 objects more in every pass, 8 instead of 6: benchmarks/operator_scale.py)."""
    key = (owner.namespace, owner.name, owner.uid)
    if key not in ctx._routerless:
        router.remove(ctx.kube, owner)
        ctx._routerless.add(key)


def reconcile_named(ctx: Context, namespace: str, name: str) -> None:
    """A pass over the latest stored state of one InferenceService (nothing if it is gone or going).

    Every handler comes here: under the per-object lock, the object is read fresh, so passes that
    queue up behind each other see each other's writes and do not repeat them.
    """
    with ctx.lock_for(namespace, name):
        _reconcile_fresh(ctx, namespace, name)


def reconcile_soon(ctx: Context, namespace: str, name: str) -> None:
    """`reconcile_named` for events that only say "something of it changed" (its children's).

    A pass already waiting for the lock covers such an event: it reads everything fresh once it runs, after the
    event. So at most one pass waits per object and later events return at once: an operator that restarts
    over an InferenceService makes two such passes, not one per child event in a row (11 for 5 pods on kmock),
    which the resume's pass and the autoscaler's first pass waited behind.
    """
    key = (namespace, name)
    with ctx._guard:
        if key in ctx._queued:
            return
        ctx._queued.add(key)
    with ctx.lock_for(namespace, name):
        with ctx._guard:
            ctx._queued.discard(key)   # before the read: an event from now on needs a pass of its own
        _reconcile_fresh(ctx, namespace, name)


def _reconcile_fresh(ctx: Context, namespace: str, name: str) -> None:
    try:
        body = ctx.kube.get(resource_path(API_VERSION, KIND, namespace, name))
    except ApiException as e:
        raise kopf.TemporaryError(f"cannot read {namespace}/{name}: {e.status} {e.reason}", delay=10) from e
    if body is None or body["metadata"].get("deletionTimestamp"):
        return  # garbage collection takes the children
    reconcile(ctx, body)
