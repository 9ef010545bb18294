"""The autoscaler against kmock: a stand-in Prometheus HTTP API whose answers the test sets, the InferenceService
and its pods, and waits on what the running operator did (tests/operator/test_autoscaler_kmock.py and
test_autoscaler_idle_kmock.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from kubeinfer.operator.config import OperatorConfig

from support.manifests import condition
from support.operator_harness import NAMESPACE, child_path, isvc_path
from support.query_endpoint import serve_query_endpoint

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
DEPLOYMENT = child_path("Deployment", NAMESPACE, NAME)
INTERVAL = 0.2


@dataclasses.dataclass
class FakePrometheus:
    """Values the PromQL queries answer; None answers an empty vector (no series)."""

    queue: float | None = 0.0
    running: float | None = 0.0
    ttft_p95: float | None = None
    rate: float | None = 0.0
    pods: float | None = 1.0
    queries: list[str] = dataclasses.field(default_factory=list)
    url: str = ""

    def answer(self, query: str) -> float | None:
        self.queries.append(query)
        if query.startswith("sum by (namespace, service, model_name, pool) (kubeinfer_num_requests_waiting"):
            return self.queue
        if query.startswith("sum by (namespace, service, model_name, pool) (kubeinfer_num_requests_running"):
            return self.running
        if query.startswith("histogram_quantile(0.95"):
            return self.ttft_p95
        if query.startswith("sum by (namespace, service, model_name, pool) (rate("):
            return self.rate
        if query.startswith("count by ("):
            return self.pods if self.queue is not None else None
        if query.startswith("min by (namespace, service, model_name, pool) (timestamp("):
            return time.time() if self.queue is not None else None
        if "increase(kubeinfer_engine_step" in query or "increase(kubeinfer_request_" in query:
            return None   # the predictive policy's calibration series: none here (the reactive policy decides)
        raise AssertionError(f"unexpected query {query}")

    async def handle(self, request: web.Request) -> web.Response:
        """The fleet's rows: this service's values, and another service's (a decoy, queue 100) beside them."""
        value = self.answer(request.query["query"])
        result = [{"metric": {"namespace": NAMESPACE, "service": "decoy", "model_name": "decoy"},
                   "value": [time.time(), "100.0"]}]
        if value is not None:
            result.append({"metric": {"namespace": NAMESPACE, "service": NAME, "model_name": NAME},
                           "value": [time.time(), repr(float(value))]})
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})


@contextlib.asynccontextmanager
async def serve_prometheus() -> AsyncIterator[FakePrometheus]:
    """A FakePrometheus on loopback, for the tests' `prom` fixture."""
    fake = FakePrometheus()
    async with serve_query_endpoint(fake.handle) as fake.url:
        yield fake


async def quiesce(kapi: Any) -> None:
    """Delete the InferenceService and wait until it is gone: kopf stops its daemon and removes the
    finalizer. (Stopping the operator with the daemon running costs 5 s: kopf cancels it at exit,
    respawns it for a late event, then waits for it.)"""
    status, _ = await kapi.call("DELETE", ISVC)
    assert status == 200
    await kapi.gone(ISVC, "the finalizer was never removed")


def config_for(prom: FakePrometheus) -> OperatorConfig:
    return OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True, service_monitor="never",
                          prometheus_url=prom.url, autoscale_interval_seconds=INTERVAL)


def manifest(replicas: int = 1, **autoscaling: Any) -> dict[str, Any]:
    scaling = {"minReplicas": 1, "maxReplicas": 6, "targetQueueDepthPerReplica": 2, "initialDelaySeconds": 0,
               "scaleDownStabilizationSeconds": 2, **autoscaling}
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen", "generation": 1,
                         # kmock keeps no resourceVersion; kopf's finalizer patch tests it
                         "resourceVersion": "1"},
            "spec": {"model": {"uri": "pvc://models/qwen"}, "replicas": replicas, "autoscaling": scaling}}


async def ready_pods(kapi: Any, n: int, first: int = 0) -> None:
    """n Ready pods of the service, created an hour ago (what the Deployment would have made)."""
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    for i in range(first, first + n):
        await kapi.create(f"/api/v1/namespaces/{NAMESPACE}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-{i}", "namespace": NAMESPACE, "creationTimestamp": old, "labels": {
                "kubeinfer.dev/inferenceservice": NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}})


