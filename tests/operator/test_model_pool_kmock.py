"""The running operator with spec.modelPool (reconcile.model_pool, model_pool_status): kmock stands in for the API
server and a stand-in engine per model of the one ready replica (127.0.0.1, on consecutive ports) reports its sleep
level and wake-ups as the runtime's /metrics does. The replicas run `kubeinfer pool`, the router gets each model's
port, and status.modelPool follows the swaps. Sleeps and wakes change no Kubernetes object: on a real API server
the periodic pass (adapter_sync_seconds) alone brings them to the status, which tests/e2e/test_model_pool_cluster.py
shows; kmock keeps no resourceVersion, so kopf makes passes of its own here and cannot tell the two apart."""

from __future__ import annotations

import http.server
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import pod as pod_builder
from kubeinfer.operator.reconcile.builders import INSTANCE_LABEL
from support import free_port_run
from support.operator_harness import NAMESPACE, KApi, child_path, isvc_path, running_operator

NAME = "pool"
ISVC = isvc_path(NAMESPACE, NAME)
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SPEC = {"model": {"uri": "file:///opt/demo"}, "router": {},
        "modelPool": {"models": [{"servedName": "moe", "uri": "file:///opt/demo-moe"}]}}


class Engines(http.server.BaseHTTPRequestHandler):
    """Each port's engine: `levels[port]` = (sleep level, wake-ups)."""
    levels: dict[int, tuple[int, int]] = {}

    def do_GET(self):
        level, wakeups = self.levels[self.server.server_port]
        body = (f'kubeinfer_engine_sleep_level{{model_name="m"}} {float(level)}\n'
                f'kubeinfer_engine_wakeups_total{{cause="api",model_name="m"}} {float(wakeups)}\n').encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    port = free_port_run(2)
    Engines.levels = {port: (1, 0), port + 1: (0, 0)}   # as `kubeinfer pool` starts them: the last one awake
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", p), Engines) for p in (port, port + 1)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(pod_builder, "PORT", port)   # the first model's port, in the pods and in the status pass
    yield port
    for server in servers:
        server.shutdown()


@pytest.fixture()
async def operator(cluster: Any) -> AsyncIterator[Any]:
    config = OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True, service_monitor="never",
                            adapter_sync_seconds=0.3)
    async with running_operator(cluster, config):
        yield cluster
        kapi = KApi(str(cluster.url))
        await kapi.call("DELETE", ISVC)   # kopf stops the pool's periodic pass and drops its finalizer
        await kapi.gone(ISVC, "the finalizer was never removed")


def replica_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-0", "namespace": NAMESPACE,
                         "labels": {INSTANCE_LABEL: NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}


def replicas(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return ((obj.get("status") or {}).get("modelPool") or {}).get("replicas") or []


async def test_the_replicas_run_the_pool_and_the_status_follows_the_swaps(operator: Any, kapi: Any, engines: int) -> None:
    await kapi.create(isvc_path(NAMESPACE), {
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-pool", "generation": 1, "resourceVersion": "1"},
        "spec": SPEC})
    dep = await kapi.eventually(child_path("Deployment", NAMESPACE, NAME), lambda d: True)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["kubeinfer", "pool"]
    assert container["args"][:4] == ["--member", "pool=/opt/demo", "--member", "moe=/opt/demo-moe"]
    router = await kapi.eventually(child_path("Deployment", NAMESPACE, f"{NAME}-router"), lambda d: True)
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--pool-model"] == [f"pool={engines}",
                                                                               f"moe={engines + 1}"]

    await kapi.create(PODS, replica_pod())
    obj = await kapi.eventually(ISVC, lambda o: replicas(o) and replicas(o)[0]["awake"] == ["moe"])
    assert replicas(obj) == [{"pod": f"{NAME}-0", "awake": ["moe"], "asleep": ["pool"], "wakeups": 0}]
    Engines.levels = {engines: (0, 1), engines + 1: (1, 0)}   # the router swapped them: nothing in Kubernetes moved
    obj = await kapi.eventually(ISVC, lambda o: replicas(o) and replicas(o)[0]["awake"] == ["pool"])
    assert replicas(obj)[0] == {"pod": f"{NAME}-0", "awake": ["pool"], "asleep": ["moe"], "wakeups": 1}
    assert obj["status"]["modelPool"]["maxAwake"] == 1
