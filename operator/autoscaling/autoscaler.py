"""The autoscaler's pass over one InferenceService: measure, decide, write spec.replicas, status, Events.

`plan_pass()` is pure: from the stored object, its pods and the signals it computes everything the pass
writes (a `Plan`). `Autoscaler` does the I/O around it and `run()` is the loop of the per-object kopf
daemon registered in `kubeinfer.operator.handlers`.

Policy of the pass (the scaling rules themselves are in `policy.decide`, and with `autoscaling.policy:
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
import dataclasses
import logging
import time
from typing import Any

import kopf
from kubernetes.client import ApiException
from pydantic import ValidationError

from kubeinfer.operator.autoscaling.cold_start import ColdStartRecord, parse_time
from kubeinfer.operator.autoscaling.history_status import RememberedHistory, history_for, history_status
from kubeinfer.operator.autoscaling.metrics_source import (
    PodSelector, ScrapeSource, router_queue, with_router_queue,
)
from kubeinfer.operator.autoscaling.policy import METRICS_STALE, METRICS_UNAVAILABLE, decide
from kubeinfer.operator.autoscaling.policy_types import PolicyConfig, ReplicaCounts, ScaleDecision, Signals
from kubeinfer.operator.autoscaling.predictive_pass import decide_predictive
from kubeinfer.operator.autoscaling.readers import SharedReaders
from kubeinfer.operator.events import EventSpec, condition_events
from kubeinfer.operator.kube import FIELD_MANAGER, MERGE_PATCH, resource_path
from kubeinfer.operator.reconcile import builders, pod as pod_builder, router, status as status_mod
from kubeinfer.operator.reconcile.controller import own_pods
from kubeinfer.operator.spec import (
    API_VERSION, KIND, METRICS_AVAILABLE, SCALING_ACTIVE, InferenceServiceSpec, parse_spec,
)
from kubeinfer.operator.times import rfc3339

log = logging.getLogger(__name__)

MANUAL_SCALE_OVERRIDDEN = "ManualScaleOverridden"
# Labels that the Prometheus Operator attaches to series scraped through our ServiceMonitor.
PROMETHEUS_LABELS = ("namespace", "service")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one pass writes. `replicas` is None when spec.replicas already holds the decision."""

    decision: ScaleDecision
    current: int  # the count the policy decided from
    replicas: int | None
    status: dict[str, Any]
    events: tuple[EventSpec, ...]


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((pod.get("status") or {}).get("conditions") or []))


def live_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods that are not being deleted."""
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def replica_counts(current: int, pods: list[dict[str, Any]], initial_delay_s: float, now: float) -> ReplicaCounts:
    """Ready = Ready condition and created at least initialDelaySeconds ago (a real API server always sets
    creationTimestamp; without one a pod counts as old). Pending = the rest of the larger of the desired
    count and the live pods: replicas the Deployment has not created yet are pending too."""
    live = live_pods(pods)
    ready = 0
    for p in live:
        created = parse_time((p.get("metadata") or {}).get("creationTimestamp"))
        if _is_ready(p) and (created is None or now - created >= initial_delay_s):
            ready += 1
    return ReplicaCounts(current=current, ready=ready, pending=max(current, len(live)) - ready)


def scrape_targets(pods: list[dict[str, Any]]) -> list[str]:
    """/metrics of the ready pods (a loading pod is not listening yet and runs no requests)."""
    return [f"http://{p['status']['podIP']}:{pod_builder.PORT}/metrics" for p in live_pods(pods)
            if _is_ready(p) and (p.get("status") or {}).get("podIP")]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _conditions(signals: Signals, decision: ScaleDecision) -> list[dict[str, Any]]:
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
    conditions = status_mod.merge_conditions(st.get("conditions") or [], _conditions(signals, decision), rfc3339(now),
                                             (body.get("metadata") or {}).get("generation"))
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


class Autoscaler:
    """The I/O of one InferenceService's passes. Its metrics source keeps state between passes (the
    direct-scrape snapshots), so one instance lives as long as the object's daemon."""

    def __init__(self, ctx: Any, namespace: str, name: str, readers: SharedReaders | None = None) -> None:
        self.ctx, self.namespace, self.name = ctx, namespace, name
        self._own_readers = None if readers is not None else SharedReaders.for_config(ctx.config)
        self.readers = readers or self._own_readers
        assert self.readers is not None
        self.prometheus = self.readers.prometheus
        self.source = None if self.prometheus else ScrapeSource(client=self.readers.scrape_client)
        self.router_client = self.readers.router_client
        self.path = resource_path(API_VERSION, KIND, namespace, name)
        self.remembered: RememberedHistory | None = None  # the last pass's history, and what it wrote
        self.clock = time.time  # the passes' time (a test drives its own)

    async def aclose(self) -> None:
        if self._own_readers is not None:
            await self._own_readers.aclose()

    def _read(self) -> tuple[dict[str, Any] | None, InferenceServiceSpec | None, list[dict[str, Any]]]:
        body = self.ctx.kube.get(self.path)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None, None, []
        try:
            spec = parse_spec(body.get("spec") or {})
        except ValidationError:
            return body, None, []  # reconcile reports it; nothing to scale
        if spec.autoscaling is None:
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

    async def _router_pods_queue(self, body: dict[str, Any]) -> float | None:
        """Requests waiting at the operator's router pods, summed (each holds its own); read directly from the
        Ready ones' /metrics at every pass, like `routerMetricsUrl`. None when no router pod answers."""
        pods = await asyncio.to_thread(router.router_pods, self.ctx.kube, builders.Owner.from_body(body))
        urls = [f"http://{p['status']['podIP']}:{router.PORT}/metrics" for p in live_pods(pods)
                if _is_ready(p) and (p.get("status") or {}).get("podIP")]
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

    async def step(self) -> Plan | None:
        """One pass; None when the object is gone, invalid, or no longer autoscaled."""
        body, spec, pods = await asyncio.to_thread(self._read)
        if body is None or spec is None:
            return None
        signals = await self._signals(spec, body, pods)
        return await asyncio.to_thread(self._decide_and_write, signals)

    def _decide_and_write(self, signals: Signals) -> Plan | None:
        # Under the object's lock: reconcile merges the same conditions list from a fresh read.
        with self.ctx.lock_for(self.namespace, self.name):
            body, spec, pods = self._read()
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
            log.info("autoscale %s/%s: %s %d -> %d (recommended %s) %s", self.namespace, self.name, d.reason,
                     plan.current, d.desired_replicas, d.recommendation, d.message)
            return plan


async def run(ctx: Any, namespace: str, name: str, stopped: kopf.DaemonStopped,
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
