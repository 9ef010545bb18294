"""Every kopf handler of the operator, registered here and nowhere else. Each is a few lines.

- startup: all settings (one place), the API client, whether ServiceMonitors exist.
- login: kopf connects with the same credentials as the applier.
- InferenceService create/update/resume: a reconcile pass.
- events of owned Deployments, Services, PDBs and pods: a reconcile pass of the owner, which repairs
  hand edits and deletions and refreshes status (pods failing to pull, crash, or be scheduled), and tells
  the router pods which replicas are ready; not for an event that shows nothing new (reconcile/child_view.py).

- autoscaler: one kopf daemon per InferenceService with `spec.autoscaling` (a timer whose interval is
  the operator setting `autoscale_interval_seconds`), running `autoscaler.run`.
- adapters: one kopf daemon per InferenceService with `spec.adapters` or `spec.modelPool`, a reconcile pass every
  `adapter_sync_seconds`: it loads adapters the pods have fetched since, and retries refused ones; it refreshes
  which of a pool's models are awake where (reconcile.model_pool).

No deletion handlers. kopf puts its finalizer (`kubeinfer.dev/finalizer`) only on objects with a daemon
(autoscaled, or with adapters), so that it stops their daemon before they go; it removes it when the field
is removed. Deleting such an InferenceService therefore needs the operator running (or the finalizer removed
by hand).
Children are left to the API server's garbage collector through owner references.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import urllib3

from kubeinfer.operator.autoscaling import autoscaler
from kubeinfer.operator.autoscaling.signals.readers import SharedReaders
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.kube import Kube, connection_info, load_configuration
from kubeinfer.operator.preflight import unreachable_reason
from kubeinfer.operator.reconcile import builders, inference_pool, router
from kubeinfer.operator.reconcile.controller import Context, InvalidSpec, reconcile_named, reconcile_soon
from kubeinfer.operator.spec import GROUP, PLURAL, POOLS, VERSION

log = logging.getLogger(__name__)

OWNED_LABELS = {builders.MANAGED_BY_LABEL: builders.MANAGED_BY}
OWNED_SELECTOR = f"{builders.MANAGED_BY_LABEL}={builders.MANAGED_BY}"
EXIT_GRACE_SECONDS = 0.5     # on SIGTERM: what workers and daemons get to finish
# (group, version, plural) -> kind of each child resource watched (a watch event's object need not say its kind)
CHILD_RESOURCES = {("apps", "v1", "deployments"): "Deployment", ("", "v1", "services"): "Service",
                   ("policy", "v1", "poddisruptionbudgets"): "PodDisruptionBudget", ("", "v1", "pods"): "Pod"}
CHILD_KINDS = {plural: kind for (_, _, plural), kind in CHILD_RESOURCES.items()}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    # Progress and the last-handled spec live in annotations of our own group; status stays ours.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Only kopf's warnings and errors (a failed handler) become Kubernetes Events; what the operator has to
    # say (condition changes, scaling) it posts itself, aggregated and rate-limited (operator.events).
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = not config.scanning
    settings.watching.server_timeout = 300
    settings.execution.max_workers = config.handler_threads
    # Stopping (SIGTERM: a rollout, an uninstall that also deletes our RBAC): what is in flight is idempotent and
    # the next copy redoes it, so the operator does not wait for it. Workers get a moment, then kopf gives up on them
    # (operator.__main__ ends the process a second after the signal whatever is left).
    settings.batching.exit_timeout = EXIT_GRACE_SECONDS
    for group, version, plural in CHILD_RESOURCES:
        settings.watching.label_selectors[group, version, plural] = OWNED_SELECTOR
    kube = Kube(load_configuration())
    try:
        with_sm = config.service_monitor == "always" or (
            config.service_monitor == "auto" and kube.has_api("monitoring.coreos.com/v1", "servicemonitors"))
    except (urllib3.exceptions.HTTPError, OSError) as error:   # one line, no traceback (kopf retries)
        raise kopf.TemporaryError(f"cannot reach the API server: {unreachable_reason(error)}", delay=10) from None
    memo["ctx"] = Context(kube=kube, config=config, with_service_monitor=with_sm)
    memo["readers"] = SharedReaders.for_config(config)   # every autoscaler daemon's clients, made once
    log.info("kubeinfer operator configured: image=%s serviceMonitor=%s namespaces=%s",
             config.runtime_image, with_sm, list(config.namespaces) or "all")


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    return connection_info(load_configuration())


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile_service(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    try:
        reconcile_named(memo["ctx"], namespace, name)
    except InvalidSpec as e:
        # Final, as a kopf.PermanentError is, without kopf's "failed permanently" Event: the status and our
        # own Event already carry the message, once.
        log.info("%s/%s: %s", namespace, name, e)


@kopf.on.event("apps", "v1", "deployments", labels=OWNED_LABELS)
@kopf.on.event("", "v1", "services", labels=OWNED_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=OWNED_LABELS)
@kopf.on.event("", "v1", "pods", labels=OWNED_LABELS)
def child_changed(labels: kopf.Labels, namespace: str, memo: kopf.Memo, type: str | None, body: kopf.Body,
                  resource: kopf.Resource, **_: Any) -> None:
    owner = labels.get(builders.INSTANCE_LABEL) or labels.get(router.ROUTER_LABEL)   # a replica's, or a router's pod
    # An event showing nothing a pass has not seen (the echo of its own write, a PDB's status) makes no pass.
    if owner and namespace and memo["ctx"].children.is_news(type, body, CHILD_KINDS.get(resource.plural)):
        try:
            reconcile_soon(memo["ctx"], namespace, owner)
        except (kopf.PermanentError, inference_pool.PoolUnavailable):
            pass  # a bad spec is already reported in the owner's status; a missing CRD by its own handler


def _autoscaled(spec: kopf.Spec, **_: Any) -> bool:
    pools = spec.get("disaggregation") or {}
    return bool(spec.get("autoscaling")) or any((pools.get(role) or {}).get("autoscaling") for role in POOLS)


@kopf.daemon(GROUP, VERSION, PLURAL, id="autoscaler", when=_autoscaled,
             cancellation_backoff=EXIT_GRACE_SECONDS, cancellation_timeout=EXIT_GRACE_SECONDS)
async def autoscale(name: str, namespace: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    await autoscaler.run(memo["ctx"], namespace, name, stopped, memo.get("readers"))


def _has_adapters(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("adapters")) or spec.get("modelPool") is not None


@kopf.daemon(GROUP, VERSION, PLURAL, id="adapters", when=_has_adapters,
             cancellation_backoff=EXIT_GRACE_SECONDS, cancellation_timeout=EXIT_GRACE_SECONDS)
async def resync_adapters(name: str, namespace: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    ctx: Context = memo["ctx"]
    while not stopped:
        await stopped.wait(ctx.config.adapter_sync_seconds)
        if stopped:
            return
        try:
            await asyncio.to_thread(reconcile_soon, ctx, namespace, name)
        except (kopf.PermanentError, kopf.TemporaryError, inference_pool.PoolUnavailable) as error:
            log.info("%s/%s: adapters resync: %s", namespace, name, error)
