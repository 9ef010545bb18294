"""The ClusterRole the install grants is exactly what the operator needs.

tests/operator checks that every request the operator makes is allowed by `rbac.RULES`; this is the converse:
every (group, resource, verb) that `rbac.RULES` grants is exercised by a request the operator makes in the
scenarios below (run against kmock, as in tests/operator), or is listed in JUSTIFIED with the reason the
scenarios cannot exercise it. The rendered ClusterRole equals `rbac.RULES` (test_install_yaml, test_chart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.install.rbac import RULES
from kubeinfer.operator.spec import GROUP, KIND, VERSION
from support import operator_harness as harness


NS = harness.NAMESPACE

# Granted but not reachable against kmock, each for a stated reason.
JUSTIFIED: dict[tuple[str, str, str], str] = {
    **{("kopf.dev", plural, verb): "peering: the tests run standalone (one operator copy)"
       for plural in ("clusterkopfpeerings", "kopfpeerings") for verb in ("get", "list", "watch", "patch")},
    ("", "namespaces", "list"): "kopf namespace scanning (globs in watchNamespaces); kmock answers 500 to it",
    ("", "namespaces", "watch"): "kopf namespace scanning, as above",
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"): "kopf CRD scanning, off in the tests",
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"): "kopf CRD scanning, off in the tests",
}


def granted() -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in RULES for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.fixture()
def cluster(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return harness.serve_cluster(kmock, tmp_path, monkeypatch, {
        "monitoring.coreos.com/v1/servicemonitors": kmock_lib.ResourceInfo(
            kind="ServiceMonitor", namespaced=True, verbs={"get", "list", "create", "patch"}),
        "inference.networking.k8s.io/v1/inferencepools": kmock_lib.ResourceInfo(
            kind="InferencePool", namespaced=True, verbs={"get", "list", "create", "patch", "delete"})})


def isvc(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
            "spec": {"model": {"uri": "pvc://models/m"}, **spec}}


async def test_every_granted_permission_is_used_or_justified(cluster: Any) -> None:
    kapi = harness.KApi(str(cluster.url))
    config = OperatorConfig(scanning=False, namespaces=(NS,), standalone=True, service_monitor="auto")
    deployment = harness.child_path("Deployment", NS, "a")
    async with harness.running_operator(cluster, config):
        await kapi.create(harness.isvc_path(NS), isvc("a", replicas=2))
        await kapi.eventually(harness.child_path("ServiceMonitor", NS, "a"), lambda o: True)
        await kapi.patch(harness.isvc_path(NS, "a"), {"spec": {"replicas": 3}})
        await kapi.eventually(deployment, lambda d: d["spec"]["replicas"] == 3)
        await kapi.delete(deployment)  # repaired: read, then written again
        await kapi.eventually(deployment, lambda d: d["spec"]["replicas"] == 3)
        await kapi.patch(harness.child_path("ServiceMonitor", NS, "a"), {"spec": {"endpoints": []}})
        await kapi.eventually(harness.child_path("ServiceMonitor", NS, "a"), lambda s: s["spec"]["endpoints"])
        await kapi.eventually(harness.isvc_path(NS, "a"), lambda o: (o.get("status") or {}).get("conditions"))
        # A pod that cannot be scheduled, twice: an Event, then its count raised (create, then patch of Events).
        for _ in range(2):
            await kapi.create(f"/api/v1/namespaces/{NS}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "a-1", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "kubeinfer",
                                                            "kubeinfer.dev/inferenceservice": "a"}},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                           "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}})
            await kapi.eventually(harness.isvc_path(NS, "a"), lambda o: any(
                c["type"] == "Degraded" and c["status"] == "True" for c in o["status"]["conditions"]))
            await kapi.delete(f"/api/v1/namespaces/{NS}/pods/a-1")
            await kapi.eventually(harness.isvc_path(NS, "a"), lambda o: any(
                c["type"] == "Degraded" and c["status"] == "False" for c in o["status"]["conditions"]))
        # A router and an InferencePool: made, the router pod told its replicas, then both turned off.
        await kapi.create(harness.isvc_path(NS), isvc("b", router={}, inferencePool={"endpointPicker": "epp"}))
        pool = f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools/b"
        await kapi.eventually(pool, lambda o: True)
        labels = {"app.kubernetes.io/managed-by": "kubeinfer"}
        await kapi.create(f"/api/v1/namespaces/{NS}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "b-router-1", "namespace": NS, "labels": {**labels, "kubeinfer.dev/router": "b"}}})
        await kapi.eventually(f"/api/v1/namespaces/{NS}/pods/b-router-1",
                              lambda p: (p["metadata"].get("annotations") or {}).get("kubeinfer.dev/router-endpoints"))
        await kapi.patch(harness.isvc_path(NS, "b"), {"spec": {"router": {"enabled": False}, "inferencePool": None}})
        await kapi.eventually(harness.isvc_path(NS, "b"),
                              lambda o: (o.get("status") or {}).get("endpoint") == "http://b.default.svc/v1")
        for path in (pool, harness.child_path("Deployment", NS, "b-router")):
            await kapi.gone(path, f"{path} not deleted")
        # LoRA adapters: their ConfigMap made, then changed. The service names an API keys Secret: the operator
        # must not read it (the replicas follow their list; no rule grants Secrets: `used <= rules` below).
        await kapi.create(f"/api/v1/namespaces/{NS}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "keys", "namespace": NS}, "data": {"api-keys": "c2stMQo="}})
        with_adapters = isvc("c", runtime={"lora": {}}, apiKeySecretRef={"name": "keys"},
                             adapters=[{"name": "x", "uri": "hf://org/x"}])
        with_adapters["metadata"]["resourceVersion"] = "1"   # kmock keeps none; kopf's finalizer patch tests it
        await kapi.create(harness.isvc_path(NS), with_adapters)
        configmap = f"/api/v1/namespaces/{NS}/configmaps/c-adapters"
        await kapi.eventually(configmap, lambda o: "hf://org/x" in o["data"]["fetch.sh"])
        await kapi.patch(harness.isvc_path(NS, "c"), {"spec": {"adapters": [{"name": "y", "uri": "hf://org/y"}]}})
        await kapi.eventually(configmap, lambda o: "hf://org/y" in o["data"]["fetch.sh"])
        await kapi.delete(harness.isvc_path(NS, "c"))   # while the operator runs: kopf stops its adapters' daemon
        await kapi.gone(harness.isvc_path(NS, "c"), "c not deleted")
    used = harness.permissions_used(cluster)
    rules = granted()
    unexplained = rules - used - set(JUSTIFIED)
    assert not unexplained, f"granted but never used nor justified (remove from rbac.RULES?): {sorted(unexplained)}"
    stale = set(JUSTIFIED) & used
    assert not stale, f"now exercised, drop from JUSTIFIED: {sorted(stale)}"
    assert set(JUSTIFIED) <= rules, f"justified but not granted: {sorted(set(JUSTIFIED) - rules)}"
    # The other direction (tests/operator checks it too): nothing used that is not granted.
    assert used <= rules, f"used but not granted: {sorted(used - rules)}"
