"""The running operator with spec.modelPool (reconcile.model_pool, model_pool_status): kmock stands in for the API
server and a stand-in engine per model of the one ready replica (127.0.0.1, on consecutive ports) reports its sleep
level and wake-ups as the runtime's /metrics does. The replicas run `kubeinfer pool`, the router gets each model's
port, and status.modelPool follows the swaps. Sleeps and wakes change no Kubernetes object: on a real API server
the periodic pass (adapter_sync_seconds) alone brings them to the status, which tests/e2e/test_model_pool_cluster.py
shows; kmock keeps no resourceVersion, so kopf makes passes of its own here and cannot tell the two apart."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from kubeinfer.operator.reconcile import pod as pod_builder
from kubeinfer.operator.reconcile.builders import INSTANCE_LABEL
from support.pool_engines import stand_in_engines
from support.operator_harness import NAMESPACE, child_path, isvc_path, operator_with_periodic_pass

NAME = "pool"
ISVC = isvc_path(NAMESPACE, NAME)
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SPEC = {"model": {"uri": "file:///opt/demo"}, "router": {},
        "modelPool": {"models": [{"servedName": "moe", "uri": "file:///opt/demo-moe"}]}}


@pytest.fixture()
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, dict[int, tuple[int, int]]]]:
    with stand_in_engines([(1, 0), (0, 0)]) as (port, states):   # as `kubeinfer pool` starts them: the last awake
        monkeypatch.setattr(pod_builder, "PORT", port)   # the first model's port, in the pods and in the status pass
        yield port, states


@pytest.fixture()
async def operator(cluster: Any) -> AsyncIterator[Any]:
    async with operator_with_periodic_pass(cluster, ISVC):
        yield cluster


def replica_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-0", "namespace": NAMESPACE,
                         "labels": {INSTANCE_LABEL: NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}


def replicas(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return ((obj.get("status") or {}).get("modelPool") or {}).get("replicas") or []


async def test_the_replicas_run_the_pool_and_the_status_follows_the_swaps(operator: Any, kapi: Any,
                                                                          engines: tuple) -> None:
    port, states = engines
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
    assert [args[i + 1] for i, a in enumerate(args) if a == "--pool-model"] == [f"pool={port}", f"moe={port + 1}"]

    await kapi.create(PODS, replica_pod())
    obj = await kapi.eventually(ISVC, lambda o: replicas(o) and replicas(o)[0]["awake"] == ["moe"])
    assert replicas(obj) == [{"pod": f"{NAME}-0", "awake": ["moe"], "asleep": ["pool"], "wakeups": 0}]
    states.update({port: (0, 1), port + 1: (1, 0)})   # the router swapped them: nothing in Kubernetes moved
    obj = await kapi.eventually(ISVC, lambda o: replicas(o) and replicas(o)[0]["awake"] == ["pool"])
    assert replicas(obj)[0] == {"pod": f"{NAME}-0", "awake": ["pool"], "asleep": ["moe"], "wakeups": 1}
    assert obj["status"]["modelPool"]["maxAwake"] == 1
