"""The autoscaler's pass over one InferenceService: measure, decide, write spec.replicas, status, Events.

`plan.plan_pass()` is pure: from the stored object, its pods and the signals it computes everything the pass
writes (a `Plan`); with spec.disaggregation, `pool_pass` plans each pool so and binds them. `Autoscaler` does the
I/O around it and `run()` is the loop of the per-object kopf
daemon registered in `kubeinfer.operator.handlers`.

Policy of the pass (the scaling rules themselves are in `policies.reactive.decide`, and with `autoscaling.policy:
predictive` in `predictive_pass.decide_predictive`, which takes over from it where a forecast has something to
say; its state and last forecast are in `status.predictive`):
- The autoscaler owns `spec.replicas` while `spec.autoscaling` is set, and writes it with a merge patch on
  the object (so `kubectl get` shows the decision and reconcile applies it to the Deployment; the
  autoscaler never touches the Deployment itself, so the two never fight).
- `status.desiredReplicas` is its last decision once `status.scalingHistory` exists (before that, reconcile
  writes the starting size there, so that `kubectl get`'s DESIRED is never blank). A `spec.replicas` that
  differs from its decision was set by someone else (`kubectl scale`): the pass decides from its own last
  value, writes its decision back and says so in an Event (`ManualScaleOverridden`). Without a recorded
  decision (first pass), the user's `spec.replicas` is the starting size.
- Status is written before spec.replicas: an operator that dies between the two writes resumes from the
  recorded decision and completes it.
- `status.scalingHistory` is the policy's `ScaleHistory` (windows, last scale time, learned capacity):
  a restarted operator decides as an uninterrupted one would. The running one decides from the history it
  remembers, and status changes only when what a restart needs does (`history_status`): idle, nothing is
  written. `status.lastSignals` carries no time for the same reason.
- `status.coldStartSeconds` is the cold start learned from the service's pods (creation -> Ready, the
  median of the last observations in `status.coldStartSamples`; see `cold_start`): it replaces
  initialDelaySeconds as the horizon of the policy's queue projection once one pod has been observed.
- Every change of replicas is an Event whose reason is the decision's; so is each change of status of its
  conditions (`operator.events`: metrics turning unavailable is a Warning). Conditions: `MetricsAvailable`
  (signals read or why not) and `ScalingActive` (False only while the autoscaler holds for lack of metrics).
  Times in status are RFC 3339 (`operator.times`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from kubeinfer.operator.autoscaling import pool_pass
from kubeinfer.operator.autoscaling.history_status import RememberedHistory
from kubeinfer.operator.autoscaling.plan import Plan, plan_pass
from kubeinfer.operator.autoscaling.signals import pool_signals
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.metrics_source import PodSelector, router_queue, with_router_queue
from kubeinfer.operator.autoscaling.signals.pods import PROMETHEUS_LABELS, scrape_targets
from kubeinfer.operator.autoscaling.signals.readers import SharedReaders
from kubeinfer.operator.autoscaling.signals.scrape_source import ScrapeSource
from kubeinfer.operator.kube import FIELD_MANAGER, MERGE_PATCH, resource_path
from kubeinfer.operator.reconcile import builders, router, status as status_mod
from kubeinfer.operator.reconcile.controller import Context, own_pods
from kubeinfer.operator.spec import API_VERSION, KIND, InferenceServiceSpec, parse_spec
from kubeinfer.operator.times import rfc3339_precise

log = logging.getLogger(__name__)


class Autoscaler:
    """The I/O of one InferenceService's passes. Its metrics source keeps state between passes (the
    direct-scrape snapshots), so one instance lives as long as the object's daemon."""

    def __init__(self, ctx: Context, namespace: str, name: str, readers: SharedReaders | None = None) -> None:
        self.ctx, self.namespace, self.name = ctx, namespace, name
        self._own_readers = None if readers is not None else SharedReaders.for_config(ctx.config)
        self.readers = readers or self._own_readers
        assert self.readers is not None
        self.prometheus = self.readers.prometheus
        self.source = None if self.prometheus else ScrapeSource(client=self.readers.scrape_client)
        self.router_client = self.readers.router_client
        self.path = resource_path(API_VERSION, KIND, namespace, name)
        self.remembered: RememberedHistory | None = None  # the last pass's history, and what it wrote
        # With spec.disaggregation (pool_pass): each pool's scrape history, and its last pass's history.
        self.pool_readers: pool_signals.PoolReaders | None = None
        self.pool_remembered: dict[str, RememberedHistory] = {}
        self.clock = time.time  # the passes' time (a test drives its own)

    async def aclose(self) -> None:
        if self._own_readers is not None:
            await self._own_readers.aclose()

    def read(self) -> tuple[dict[str, Any] | None, InferenceServiceSpec | None, list[dict[str, Any]]]:
        """The stored object, its parsed spec and its pods: (None, None, []) when it is gone or being deleted,
        (body, None, []) when its spec does not parse or does not autoscale."""
        body = self.ctx.kube.get(self.path)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None, None, []
        try:
            spec = parse_spec(body.get("spec") or {})
        except ValidationError:
            return body, None, []  # reconcile reports it; nothing to scale
        if spec.autoscaling is None and not pool_pass.autoscaled(spec):
            return body, None, []
        return body, spec, own_pods(self.ctx.kube, builders.Owner.from_body(body))

    async def _signals(self, spec: InferenceServiceSpec, body: dict[str, Any], pods: list[dict[str, Any]]) -> Signals:
        assert spec.autoscaling is not None
        signals = await self._pod_signals(spec, body, pods)
        if url := spec.autoscaling.router_metrics_url:
            signals = with_router_queue(signals, await router_queue(self.router_client, url), len(pods))
        elif spec.router_enabled:
            signals = with_router_queue(signals, await self._router_pods_queue(body), len(pods))
        return signals

    async def router_waiting(self, body: dict[str, Any], url: str | None) -> float | None:
        """Requests waiting at the router: at `url` (a routerMetricsUrl), else at the operator's router pods."""
        return await router_queue(self.router_client, url) if url else await self._router_pods_queue(body)

    async def _router_pods_queue(self, body: dict[str, Any]) -> float | None:
        """Requests waiting at the operator's router pods, summed (each holds its own); read directly from the
        Ready ones' /metrics at every pass, like `routerMetricsUrl`. None when no router pod answers."""
        pods = await asyncio.to_thread(router.router_pods, self.ctx.kube, builders.Owner.from_body(body))
        urls = [f"http://{p['status']['podIP']}:{router.PORT}/metrics" for p in router.serving_pods(pods)]
        found = [w for w in await asyncio.gather(*(router_queue(self.router_client, u) for u in urls)) if w is not None]
        return sum(found) if found else None

    async def _pod_signals(self, spec: InferenceServiceSpec, body: dict[str, Any],
                           pods: list[dict[str, Any]]) -> Signals:
        assert spec.autoscaling is not None
        window = spec.autoscaling.metric_window_seconds
        served = builders.served_name(spec, builders.Owner.from_body(body))
        if self.prometheus is not None:
            labels = dict(zip(PROMETHEUS_LABELS, (self.namespace, self.name)))
            return await self.prometheus.signals(PodSelector(labels, model_name=served), window)
        assert isinstance(self.source, ScrapeSource)
        return await self.source.fetch(scrape_targets(pods), window, model_name=served)

    async def step(self) -> Plan | pool_pass.PoolsPlan | None:
        """One pass; None when the object is gone, invalid, or no longer autoscaled."""
        body, spec, pods = await asyncio.to_thread(self.read)
        if body is None or spec is None:
            return None
        if spec.disaggregation is not None:   # each pool on its own signals, bound together
            return await pool_pass.step(self, body, spec, pods)
        signals = await self._signals(spec, body, pods)
        return await asyncio.to_thread(self._decide_and_write, signals)

    def _decide_and_write(self, signals: Signals) -> Plan | None:
        # Under the object's lock: reconcile merges the same conditions list from a fresh read.
        with self.ctx.lock_for(self.namespace, self.name):
            body, spec, pods = self.read()
            if body is None or spec is None:
                return None
            now = self.clock()
            plan = plan_pass(body, spec, signals, pods, now, self.remembered,
                             now - self.ctx.config.autoscale_interval_seconds)
            current = body.get("status") or {}
            patch = status_mod.status_patch(current, plan.status)
            if patch:
                self.ctx.kube.patch_status(self.path, patch)
            self.remembered = RememberedHistory(plan.status["scalingHistory"], plan.decision.history)
            if plan.replicas is not None:
                self.ctx.kube.request("PATCH", self.path, body={"spec": {"replicas": plan.replicas}},
                                      content_type=MERGE_PATCH, query={"fieldManager": FIELD_MANAGER})
            self.ctx.events.record(self.ctx.kube, body, plan.events)
            d = plan.decision
            log.info("autoscale %s/%s: %s %d -> %d (recommended %s) %s; signals of %s", self.namespace, self.name,
                     d.reason, plan.current, d.desired_replicas, d.recommendation, d.message,
                     rfc3339_precise(signals.timestamp))
            return plan


async def run(ctx: Context, namespace: str, name: str, stopped: kopf.DaemonStopped,
              readers: SharedReaders | None = None) -> None:
    """The daemon's loop: one pass per `autoscale_interval_seconds` until kopf stops it (object deleted,
    autoscaling removed, operator stopping). A failed pass is logged and the next one tries again.
    `readers`: the operator's shared clients (`readers.SharedReaders`); without them the daemon makes its own."""
    scaler = Autoscaler(ctx, namespace, name, readers)
    interval = ctx.config.autoscale_interval_seconds
    try:
        while not stopped:
            try:
                await scaler.step()
            except ApiException as e:
                log.warning("autoscale %s/%s: API error %s %s", namespace, name, e.status, e.reason)
            except Exception:  # noqa: BLE001  (one bad pass must not end the object's autoscaling)
                log.exception("autoscale %s/%s: pass failed", namespace, name)
            await stopped.wait(interval)
    finally:
        await scaler.aclose()
