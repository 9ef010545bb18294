"""The running operator's autoscaler over the pools of spec.disaggregation, against kmock and a stand-in Prometheus
whose fleet rows carry the `pool` label (as the ServiceMonitor's relabeling makes them): each pool decided on its
own signals, written to spec.disaggregation.<pool>.replicas, both pools to zero together and awake together.
The pure parts (binding, each pool's signals, the decode pool's pressure): test_disaggregation_autoscaling.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from kubeinfer.operator.reconcile import pools

from support.autoscaler_kmock import condition, quiesce
from support.operator_harness import NAMESPACE, child_path, eventually_events, isvc_path, running_operator
from support.query_endpoint import serve_query_endpoint

from kubeinfer.operator.config import OperatorConfig

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
BY = "namespace, service, model_name, pool"
# Each pass of a disaggregated service reads both pools, the router pods and 14 series: half support's pace keeps
# kmock (which scans its whole request log on every request) answering on a shared two-core box.
INTERVAL = 0.4


@dataclasses.dataclass
class PoolPrometheus:
    """Each pool's values for the fleet's queries, and the decode pool's ITL P95 and KV use queries."""

    queue: dict[str, float] = dataclasses.field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})
    running: dict[str, float] = dataclasses.field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})
    rate: dict[str, float] = dataclasses.field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})
    ttft_p95: dict[str, float | None] = dataclasses.field(default_factory=lambda: {"prefill": None, "decode": None})
    kv_usage: float | None = None
    itl_p95: float | None = None
    queries: list[str] = dataclasses.field(default_factory=list)
    url: str = ""

    def per_pool(self, query: str) -> dict[str, float | None] | None:
        if query.startswith(f"sum by ({BY}) (kubeinfer_num_requests_waiting"):
            return dict(self.queue)
        if query.startswith(f"sum by ({BY}) (kubeinfer_num_requests_running"):
            return dict(self.running)
        if query.startswith(f"histogram_quantile(0.95, sum by ({BY}, le) (rate(kubeinfer_time_to_first_token"):
            return dict(self.ttft_p95)
        if query.startswith(f"sum by ({BY}) (rate(kubeinfer_time_to_first_token"):
            return dict(self.rate)
        if query.startswith(f"count by ({BY})"):
            return {"prefill": 1.0, "decode": 1.0}
        if query.startswith(f"min by ({BY}) (timestamp("):
            return {"prefill": time.time(), "decode": time.time()}
        return None

    async def handle(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        self.queries.append(query)
        result = []
        if (values := self.per_pool(query)) is not None:
            result = [{"metric": {"namespace": NAMESPACE, "service": NAME, "model_name": NAME, "pool": role},
                       "value": [time.time(), repr(float(v))]} for role, v in values.items() if v is not None]
        elif query.startswith("histogram_quantile(0.95, sum by (le) (rate(kubeinfer_inter_token_latency"):
            assert 'pool="decode"' in query and f'service="{NAME}"' in query, query
            result = [] if self.itl_p95 is None else [{"metric": {}, "value": [time.time(), repr(self.itl_p95)]}]
        elif query.startswith("avg(kubeinfer_kv_cache_usage_ratio"):
            assert 'pool="decode"' in query, query
            result = [] if self.kv_usage is None else [{"metric": {}, "value": [time.time(), repr(self.kv_usage)]}]
        elif "increase(" not in query:
            raise AssertionError(f"unexpected query {query}")
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture()
async def prom() -> AsyncIterator[PoolPrometheus]:
    fake = PoolPrometheus()
    async with serve_query_endpoint(fake.handle) as fake.url:
        yield fake


def config_for(prom: PoolPrometheus) -> OperatorConfig:
    return OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True, service_monitor="never",
                          prometheus_url=prom.url, autoscale_interval_seconds=INTERVAL)


def manifest(prefill: dict[str, Any], decode: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    scaling = {"minReplicas": 1, "maxReplicas": 6, "targetQueueDepthPerReplica": 2, "initialDelaySeconds": 0,
               "scaleDownStabilizationSeconds": 2}
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen", "generation": 1,
                         "resourceVersion": "1"},
            "spec": {"model": {"uri": "pvc://models/qwen"}, "router": {}, "disaggregation": {
                "prefill": {"replicas": replicas, "autoscaling": {**scaling, **prefill}},
                "decode": {"replicas": replicas, "autoscaling": {**scaling, **decode}}}}}


async def ready_pool_pod(kapi: Any, role: str, i: int = 0) -> None:
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    await kapi.create(f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{NAME}-{role}-{i}", "namespace": NAMESPACE, "creationTimestamp": old, "labels": {
            "kubeinfer.dev/inferenceservice": NAME, pools.POOL_LABEL: role,
            "app.kubernetes.io/managed-by": "kubeinfer"}},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})


def sizes(obj: dict[str, Any]) -> tuple[int, int]:
    d = obj["spec"]["disaggregation"]
    return d["prefill"].get("replicas"), d["decode"].get("replicas")


async def test_each_pool_scales_on_its_own_signal(cluster: Any, kapi: Any, prom: PoolPrometheus) -> None:
    # Prefill: 12 waiting on 1 ready replica running 4, target 2 waiting a replica: (4 + 12) / (4 + 2) -> 3.
    # Decode: no queue, but its KV cache 95% in use against a target of 80%: 1 ready x 1.19 -> 2.
    prom.queue, prom.running = {"prefill": 12.0, "decode": 0.0}, {"prefill": 4.0, "decode": 2.0}
    prom.kv_usage, prom.ttft_p95["decode"] = 0.95, 0.2
    async with running_operator(cluster, config_for(prom)):
        await ready_pool_pod(kapi, "prefill")
        await ready_pool_pod(kapi, "decode")
        await kapi.create(isvc_path(NAMESPACE), manifest({}, {"targetKvCacheUsage": 0.8}))
        obj = await kapi.eventually(ISVC, lambda o: sizes(o) == (3, 2))
        await kapi.eventually(child_path("Deployment", NAMESPACE, f"{NAME}-prefill"),
                              lambda d: d["spec"]["replicas"] == 3)
        await kapi.eventually(child_path("Deployment", NAMESPACE, f"{NAME}-decode"),
                              lambda d: d["spec"]["replicas"] == 2)
        obj = await kapi.eventually(ISVC, lambda o: o["status"]["disaggregation"]["decode"].get("desiredReplicas") == 2
                                    and o["status"]["disaggregation"]["prefill"].get("desiredReplicas") == 3)
        # reconcile's sum of both pools follows (kubectl get's DESIRED)
        await kapi.eventually(ISVC, lambda o: o["status"].get("desiredReplicas") == 5)
        scale_ups = await eventually_events(kapi, "ScaleUp", lambda found: {
            e["message"].split(":")[0] for e in found} >= {"prefill pool", "decode pool"})   # posted after the writes
        ups = {e["message"].split(":")[0]: e["message"] for e in scale_ups}
        await quiesce(kapi)
    pools_status = obj["status"]["disaggregation"]
    prefill, decode = pools_status["prefill"], pools_status["decode"]
    assert prefill["lastSignals"]["queueDepth"] == 12.0 and "kvCacheUsage" not in prefill["lastSignals"]
    assert prefill["ttftP95Seconds"] == 0.2   # the service's TTFT, measured where the answers start
    assert decode["lastSignals"]["kvCacheUsage"] == 0.95 and "ttftP95Seconds" not in decode
    assert "queue 12 on 1 ready" in ups["prefill pool"] and ups["prefill pool"].startswith("prefill pool: 1 -> 3")
    assert "KV cache 95% in use (target 80%)" in ups["decode pool"]
    assert prefill["scalingHistory"]["events"][0]["to"] == 3 and decode["scalingHistory"]["events"][0]["to"] == 2
    metrics = condition(obj, "MetricsAvailable")
    assert metrics["status"] == "True" and "decode pool: " in metrics["message"] and "prefill pool: " in \
        metrics["message"]


async def test_decode_itl_above_its_target_grows_the_decode_pool_alone(cluster: Any, kapi: Any,
                                                                       prom: PoolPrometheus) -> None:
    prom.running = {"prefill": 0.0, "decode": 3.0}
    prom.rate, prom.itl_p95 = {"prefill": 0.0, "decode": 1.0}, 0.09   # 0.09 s against 0.05: x1.8 -> 2
    async with running_operator(cluster, config_for(prom)):
        await ready_pool_pod(kapi, "prefill")
        await ready_pool_pod(kapi, "decode")
        await kapi.create(isvc_path(NAMESPACE), manifest({}, {"targetITLP95Seconds": 0.05}))
        obj = await kapi.eventually(ISVC, lambda o: sizes(o)[1] == 2)
        await quiesce(kapi)
    assert sizes(obj) == (1, 2)
    assert "ITL P95 0.090s (target 0.05s)" in obj["status"]["disaggregation"]["decode"]["lastSignals"]["reason"] or \
        obj["status"]["disaggregation"]["decode"]["lastSignals"]["itlP95Seconds"] == 0.09


async def test_both_pools_go_to_zero_together_and_wake_together(cluster: Any, kapi: Any, prom: PoolPrometheus) -> None:
    zero = {"minReplicas": 0, "scaleToZeroIdleSeconds": 0}
    prom.running, prom.rate = {"prefill": 0.0, "decode": 1.0}, {"prefill": 0.0, "decode": 0.0}
    async with running_operator(cluster, config_for(prom)):
        await ready_pool_pod(kapi, "prefill")
        await ready_pool_pod(kapi, "decode")
        await kapi.create(isvc_path(NAMESPACE), manifest(zero, zero))
        # The prefill pool is idle, the decode pool still runs a stream: prefill would go to zero alone; it stays.
        obj = await kapi.eventually(ISVC, lambda o: ((o.get("status") or {}).get("disaggregation") or {})
                                    .get("prefill", {}).get("lastSignals", {}).get("reason") == "ScaleToZero")
        assert sizes(obj) == (1, 1)
        for _ in range(3):   # several passes: it holds
            obj = await kapi.eventually(ISVC, lambda o: True)
            assert sizes(obj) == (1, 1)
        # The stream ends: both go to zero, in one write.
        prom.running = {"prefill": 0.0, "decode": 0.0}
        obj = await kapi.eventually(ISVC, lambda o: sizes(o) != (1, 1))
        assert sizes(obj) == (0, 0)
        await kapi.eventually(ISVC, lambda o: o["status"]["disaggregation"]["decode"].get("desiredReplicas") == 0)
        # One request waits (at the decode pool's queue as the router would report it): both wake.
        prom.queue = {"prefill": 0.0, "decode": 1.0}
        obj = await kapi.eventually(ISVC, lambda o: sizes(o) != (0, 0))
        assert sizes(obj) == (1, 1)
        # Each pool's Event is posted after the write that woke both: wait for the decode pool's.
        woke = await eventually_events(kapi, "ScaleFromZero", lambda found: any(
            e["message"].startswith("decode pool: 0 -> 1") for e in found))
        wakes = [e["message"] for e in woke]
        await quiesce(kapi)
    assert any(m.startswith("decode pool: 0 -> 1") for m in wakes), wakes
    writes = [r for r in list(cluster) if r.method.value == "PATCH" and r.name == NAME and r.subresource is None
              and isinstance(r.data, dict) and (r.data.get("spec") or {}).get("disaggregation")]
    assert writes, "the autoscaler's writes of the pools' replicas were not seen"
    # Never one pool at zero beside the other (what the CEL rule would refuse): each write sets both or keeps both.
    for r in writes:
        written = {role: v["replicas"] for role, v in r.data["spec"]["disaggregation"].items()}
        assert len(set(written.values())) == 1 or 0 not in written.values(), written
