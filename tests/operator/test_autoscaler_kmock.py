"""The running operator's autoscaler against kmock and a stand-in Prometheus HTTP API on loopback.

The stand-in answers the PromQL queries of `prometheus_fleet.fleet_queries` with values the test sets, so
these tests drive the whole pass (daemon, PrometheusSource, policy, writes) with known signals; the same
pass against a real Prometheus scraping real runtime processes is tests/operator/test_autoscaler_prometheus.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.autoscaler_kmock import (
    DEPLOYMENT, INTERVAL, ISVC, NAME, FakePrometheus, condition, config_for, manifest, quiesce, ready_pods,
    serve_prometheus,
)
from support.operator_harness import (
    NAMESPACE, events, eventually_events, isvc_path, rbac_checked_requests, running_operator,
)


@pytest.fixture()
async def prom() -> AsyncIterator[FakePrometheus]:
    async with serve_prometheus() as fake:
        yield fake


async def test_queue_above_target_scales_up_through_spec_replicas(cluster: Any, kapi: Any,
                                                                  prom: FakePrometheus) -> None:
    prom.queue, prom.running, prom.ttft_p95 = 12.0, 4.0, 0.2
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 1)
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=1))
        obj = await kapi.eventually(ISVC, lambda o: (o["spec"].get("replicas") or 0) > 1)
        # queue 12 on 1 ready replica running 4, target 2 waiting/replica: (4 + 12) / (4 + 2) -> 3
        assert obj["spec"]["replicas"] == 3
        dep = await kapi.eventually(DEPLOYMENT, lambda d: d["spec"]["replicas"] == 3)
        assert dep["spec"]["replicas"] == 3
        obj = await kapi.eventually(ISVC, lambda o: o["status"].get("desiredReplicas") == 3)
        (up,) = await events(kapi, "ScaleUp")
        await quiesce(kapi)
    st = obj["status"]
    assert up["type"] == "Normal" and up["message"].startswith("1 -> 3 replicas: queue 12 on 1 ready")
    assert up["involvedObject"] == {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                                    "name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen"}
    assert (st["queueDepth"], st["ttftP95Seconds"]) == (12.0, 0.2)
    assert st["lastSignals"]["numRunning"] == 4.0 and st["lastSignals"]["reason"] in ("ScaleUp", "PendingReplicas")
    assert st["scalingHistory"]["events"][0] == {**st["scalingHistory"]["events"][0], "from": 1, "to": 3,
                                                 "reason": "ScaleUp"}
    assert st["lastScaleTime"].endswith("Z")
    assert condition(obj, "MetricsAvailable")["status"] == "True"
    assert condition(obj, "ScalingActive")["status"] == "True"
    # reconcile's conditions survive the autoscaler's writes, and the reverse
    assert condition(obj, "Ready") and condition(obj, "Progressing") and condition(obj, "Degraded")
    # kopf guards the daemon with its finalizer
    assert "kubeinfer.dev/finalizer" in obj["metadata"]["finalizers"]
    # one query for the fleet; the pass reads the row of its service (namespace, service, served model), not the
    # decoy's queue of 100
    assert "sum by (namespace, service, model_name, pool) (kubeinfer_num_requests_waiting)" in prom.queries


async def test_manual_scale_is_overridden_with_an_event(cluster: Any, kapi: Any, prom: FakePrometheus) -> None:
    # 2 ready replicas with 2 waiting each: exactly the target, nothing to change.
    prom.queue, prom.running = 4.0, 8.0
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 2)
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=2))
        # the autoscaler's first decision (before it, desiredReplicas is reconcile's starting size)
        await kapi.eventually(ISVC, lambda o: o.get("status", {}).get("scalingHistory")
                              and o["status"]["desiredReplicas"] == 2)
        assert await events(kapi) == []
        await kapi.patch(ISVC, {"spec": {"replicas": 5}})  # kubectl scale --replicas 5
        obj = await kapi.eventually(ISVC, lambda o: o["spec"]["replicas"] == 2 and o["status"]["desiredReplicas"] == 2)
        (override,) = await eventually_events(kapi, "ManualScaleOverridden")
        await quiesce(kapi)
    assert "set to 5" in override["message"] and "set it to 2" in override["message"]
    assert condition(obj, "ScalingActive")["reason"] == "WithinTolerance"


async def test_missing_metrics_hold_and_say_so(cluster: Any, kapi: Any, prom: FakePrometheus) -> None:
    prom.queue = None  # no series: the pods are not scraped
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 3)
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=3))
        obj = await kapi.eventually(ISVC, lambda o: condition(o, "MetricsAvailable").get("status") == "False")
        (warning,) = await eventually_events(kapi, "MetricsUnavailable")
        await asyncio.sleep(5 * INTERVAL)  # several more passes: still one Warning, still 3 replicas
        assert len(await events(kapi, "MetricsUnavailable")) == 1
        obj = await kapi.get(ISVC)
    assert warning["type"] == "Warning" and "no kubeinfer_num_requests_waiting series" in warning["message"]
    assert obj["spec"]["replicas"] == 3 and obj["status"]["desiredReplicas"] == 3
    assert condition(obj, "ScalingActive") == {**condition(obj, "ScalingActive"), "status": "False",
                                               "reason": "MetricsUnavailable"}
    assert obj["status"]["queueDepth"] is None if "queueDepth" in obj["status"] else True


async def test_load_gone_scales_down_after_the_window_one_step_at_a_time(cluster: Any, kapi: Any,
                                                                        prom: FakePrometheus) -> None:
    prom.queue, prom.running = 0.0, 1.0
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 3)
        start = time.time()
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=3, scaleDownStabilizationSeconds=1))
        obj = await kapi.eventually(ISVC, lambda o: o["spec"]["replicas"] == 2)
        # a fresh history never scales down before one full window
        assert time.time() - start >= 1.0
        obj = await kapi.eventually(ISVC, lambda o: o["spec"]["replicas"] == 1)
        await quiesce(kapi)
    downs = [e for e in obj["status"]["scalingHistory"]["events"] if e["reason"] == "ScaleDown"]
    assert [(e["from"], e["to"]) for e in downs] == [(3, 2), (2, 1)]


async def test_restarted_operator_resumes_from_status(cluster: Any, kapi: Any, prom: FakePrometheus) -> None:
    prom.queue, prom.running = 12.0, 4.0
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 3)
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=1, scaleDownStabilizationSeconds=30))
        before = await kapi.eventually(ISVC, lambda o: o.get("status", {}).get("desiredReplicas", 1) > 1)
    await ready_pods(kapi, before["status"]["desiredReplicas"] - 3, first=3)  # the new replicas came up
    # the load goes away while the operator is down: a fresh history would wait a whole window too, but a
    # resumed one must also keep its start, its events and its last scale time, and see no manual change.
    prom.queue, prom.running = 0.0, 0.0
    n_events = len(await events(kapi))
    async with running_operator(cluster, config_for(prom)):
        after = await kapi.eventually(ISVC, lambda o: o["status"]["lastSignals"]["queueDepth"] == 0.0)
        await asyncio.sleep(5 * INTERVAL)
        after = await kapi.get(ISVC)
        await quiesce(kapi)
    h0, h1 = before["status"]["scalingHistory"], after["status"]["scalingHistory"]
    assert h1["startedAt"] == h0["startedAt"]
    assert h1["events"][: len(h0["events"])] == h0["events"]
    assert h1["lastScaleTime"] == h0["lastScaleTime"]
    assert after["spec"]["replicas"] == after["status"]["desiredReplicas"] == before["status"]["desiredReplicas"]
    assert condition(after, "ScalingActive")["reason"] == "StabilizingDown"
    assert len(await events(kapi)) == n_events, "the restart caused Events (a manual override or a scale)"


async def test_autoscaler_requests_are_allowed_by_rbac(cluster: Any, kapi: Any, prom: FakePrometheus) -> None:
    prom.queue, prom.running = 12.0, 4.0
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 1)
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=1))
        await eventually_events(kapi, "ScaleUp")
        await quiesce(kapi)
    seen = rbac_checked_requests(cluster)
    assert {("", "events", "create"), ("kubeinfer.dev", "inferenceservices", "patch"),
            ("kubeinfer.dev", "inferenceservices/status", "patch")} <= seen


async def test_cold_start_is_learned_from_pods_and_kept_in_status(cluster: Any, kapi: Any,
                                                                  prom: FakePrometheus) -> None:
    prom.queue, prom.running = 4.0, 8.0  # at the target: the pass only observes
    now = time.time()
    for i, loaded_s in enumerate((20, 35, 300)):  # one slow pod (a cold image cache) hardly moves the median
        created = now - 3600 + 600 * i
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
        ready_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created + loaded_s))
        await kapi.create(f"/api/v1/namespaces/{NAMESPACE}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-{i}", "namespace": NAMESPACE, "creationTimestamp": stamp, "labels": {
                "kubeinfer.dev/inferenceservice": NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}],
                       "containerStatuses": [{"name": "runtime", "restartCount": 0}]}})
    async with running_operator(cluster, config_for(prom)):
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=3, initialDelaySeconds=120))
        obj = await kapi.eventually(ISVC, lambda o: o.get("status", {}).get("coldStartSeconds") is not None)
        await asyncio.sleep(3 * INTERVAL)  # more passes: the same pods add nothing
        prom.queue = 40.0  # the queue jumps: its growth is projected over the learned 35 s, not the 120 s guess
        (up,) = await eventually_events(kapi, "ScaleUp")
        obj = await kapi.get(ISVC)
        await quiesce(kapi)
    assert "over a 35s cold start" in up["message"], up["message"]
    st = obj["status"]
    assert st["coldStartSeconds"] == 35
    assert [(s["pod"], s["seconds"]) for s in st["coldStartSamples"]] == [(f"{NAME}-0", 20), (f"{NAME}-1", 35),
                                                                          (f"{NAME}-2", 300)]
