"""The running operator against an emulated Kubernetes API (kmock): create, update, drift, status.

kmock stores objects as plain JSON (merge patches, no server-side apply semantics, no generation,
no garbage collection), so these tests check what the operator *sends* and what it does next;
tests/e2e runs the same scenarios against a real API server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock as kmock_lib
import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile.builders import HASH_ANNOTATION

from support.manifests import condition
from support.operator_harness import (EVENTS, NAMESPACE, child_path, eventually_events, isvc_path,
                                      rbac_checked_requests, running_operator, settle, write_requests)

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
DEPLOYMENT = child_path("Deployment", NAMESPACE, NAME)


def manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen", "generation": 1},
            "spec": {"model": {"uri": "pvc://models/qwen"}, **spec}}


def gpus(dep: dict[str, Any]) -> str:
    return dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]


async def created(operator: Any, kapi: Any, **spec: Any) -> dict[str, Any]:
    await kapi.create(isvc_path(NAMESPACE), manifest(**spec))
    await kapi.eventually(ISVC, lambda o: condition(o, "Progressing"))
    await settle(operator)
    return await kapi.get(DEPLOYMENT)


async def test_create_builds_children_with_owner_references(operator: Any, kapi: Any) -> None:
    dep = await created(operator, kapi, parallelism={"tensor": 2})
    assert gpus(dep) == "2"
    svc = await kapi.get(child_path("Service", NAMESPACE, NAME))
    pdb = await kapi.get(child_path("PodDisruptionBudget", NAMESPACE, NAME))
    for obj in (dep, svc, pdb):
        assert obj["metadata"]["ownerReferences"] == [{
            "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "name": NAME, "uid": "uid-qwen",
            "controller": True, "blockOwnerDeletion": True}]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    # Every child write is a server-side apply by our field manager, taking ownership.
    applies = [r for r in write_requests(operator) if r.method == "PATCH" and r.subresource is None
               and r.resource.plural in ("deployments", "services", "poddisruptionbudgets")]
    assert {r.resource.plural for r in applies} == {"deployments", "services", "poddisruptionbudgets"}
    for r in applies:
        assert r.headers["Content-Type"] == "application/apply-patch+yaml"
        assert r.params == {"fieldManager": "kubeinfer-operator", "force": "true"}
        assert r.data["metadata"]["annotations"][HASH_ANNOTATION]
    # No ServiceMonitor when its CRD is absent.
    assert not [r for r in list(operator) if r.resource is not None and r.resource.plural == "servicemonitors"]


async def test_status_reports_selector_endpoint_and_generation(operator: Any, kapi: Any) -> None:
    await created(operator, kapi)
    obj = await kapi.get(ISVC)
    st = obj["status"]
    assert st["selector"] == "kubeinfer.dev/inferenceservice=qwen"
    assert st["endpoint"] == "http://qwen.default.svc/v1"
    assert st["observedGeneration"] == 1
    assert (st["replicas"], st["readyReplicas"]) == (0, 0)
    assert condition(obj, "Ready")["status"] == "False"
    assert condition(obj, "Progressing")["status"] == "True"
    status_writes = [r for r in write_requests(operator) if r.subresource == "status"]
    assert all(r.headers["Content-Type"] == "application/merge-patch+json" for r in status_writes)


async def test_spec_update_patches_the_deployment(operator: Any, kapi: Any) -> None:
    before = await created(operator, kapi)
    await kapi.patch(ISVC, {"metadata": {"generation": 2}, "spec": {"parallelism": {"tensor": 4}, "replicas": 3}})
    dep = await kapi.eventually(DEPLOYMENT, lambda d: gpus(d) == "4")
    assert dep["spec"]["replicas"] == 3
    assert "--tensor-parallel-size" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert dep["spec"]["selector"] == before["spec"]["selector"]
    assert dep["metadata"]["annotations"][HASH_ANNOTATION] != before["metadata"]["annotations"][HASH_ANNOTATION]
    await kapi.eventually(ISVC, lambda o: o["status"].get("observedGeneration") == 2)


async def test_node_caches_reach_the_applied_deployment(operator: Any, kapi: Any) -> None:
    """The compile cache and the node-local model cache, as the running operator applies them."""
    dep = await created(operator, kapi, model={"uri": "hf://org/m@v1", "cacheHostPath": "/var/lib/kubeinfer/models"},
                        runtime={"compileCache": {"hostPath": "/var/cache/kubeinfer"}})
    template = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in template["volumes"]}
    assert volumes["compile-cache"]["hostPath"] == {"path": "/var/cache/kubeinfer", "type": "DirectoryOrCreate"}
    assert volumes["model"]["hostPath"] == {"path": "/var/lib/kubeinfer/models", "type": "DirectoryOrCreate"}
    env = {e["name"]: e.get("value") for e in template["containers"][0]["env"]}
    assert env["TRITON_CACHE_DIR"] == "/var/cache/kubeinfer/triton"
    assert "flock 9" in template["initContainers"][0]["command"][-1]


async def test_noop_resync_writes_nothing(operator: Any, kapi: Any) -> None:
    await created(operator, kapi)
    assert len(write_requests(operator)) >= 4, "the write counter sees nothing; the zero below would mean nothing"
    # A second operator resumes every object (the fixture's keeps running: two passes over one state);
    # unchanged objects must cause no write at all.
    start = len(list(operator))
    async with running_operator(operator):
        await settle(operator)
    reads = [r for r in list(operator)[start:] if r.method == "GET" and r.name == NAME]
    assert reads, "the resumed operator never looked at the object"
    assert write_requests(operator, start) == []


async def test_unrelated_child_event_writes_nothing(operator: Any, kapi: Any) -> None:
    await created(operator, kapi)
    start = len(list(operator))
    await kapi.patch(DEPLOYMENT, {"metadata": {"annotations": {"example.com/note": "hi"}}})
    await settle(operator)
    ours = [r for r in write_requests(operator, start) if r.params.get("fieldManager") == "kubeinfer-operator"]
    assert ours == []
    assert len(list(operator)) - start > 1, "the child event did not reach the operator"


async def test_deleted_deployment_is_recreated(operator: Any, kapi: Any) -> None:
    before = await created(operator, kapi, parallelism={"tensor": 2})
    await kapi.delete(DEPLOYMENT)
    dep = await kapi.eventually(DEPLOYMENT, lambda d: True)
    assert gpus(dep) == "2"
    assert dep["metadata"]["annotations"] == before["metadata"]["annotations"]


async def test_hand_edited_deployment_is_restored(operator: Any, kapi: Any) -> None:
    before = await created(operator, kapi)
    image = before["spec"]["template"]["spec"]["containers"][0]["image"]
    edited = {"spec": {"template": {"spec": {"containers": [{**before["spec"]["template"]["spec"]["containers"][0],
                                                              "image": "evil/image:1"}]}}}}
    await kapi.patch(DEPLOYMENT, edited)
    dep = await kapi.eventually(DEPLOYMENT, lambda d: d["spec"]["template"]["spec"]["containers"][0]["image"] == image)
    assert dep["spec"] == before["spec"]


async def test_hand_deleted_service_is_recreated(operator: Any, kapi: Any) -> None:
    await created(operator, kapi)
    await kapi.delete(child_path("Service", NAMESPACE, NAME))
    svc = await kapi.eventually(child_path("Service", NAMESPACE, NAME), lambda s: True)
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


async def test_status_follows_deployment_readiness(operator: Any, kapi: Any) -> None:
    await created(operator, kapi, replicas=2)
    await kapi.patch(DEPLOYMENT, {"status": {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1}})
    obj = await kapi.eventually(ISVC, lambda o: o["status"].get("readyReplicas") == 1)
    assert condition(obj, "Ready")["status"] == "True"
    assert condition(obj, "Progressing")["reason"] == "LoadingModel"
    await kapi.patch(DEPLOYMENT, {"status": {"readyReplicas": 2}})
    obj = await kapi.eventually(ISVC, lambda o: o["status"].get("readyReplicas") == 2)
    assert condition(obj, "Progressing")["status"] == "False"
    assert condition(obj, "Degraded")["status"] == "False"


def unschedulable_pod(name: str = "qwen-abc") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
                "kubeinfer.dev/inferenceservice": NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}}


async def test_pod_that_cannot_get_a_gpu_is_reported(operator: Any, kapi: Any) -> None:
    await created(operator, kapi)
    await kapi.create(f"/api/v1/namespaces/{NAMESPACE}/pods", unschedulable_pod())
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["reason"] == "InsufficientGPU"
    assert "Insufficient nvidia.com/gpu" in condition(obj, "Degraded")["message"]
    assert obj["status"]["desiredReplicas"] == 1   # DESIRED, with spec.replicas unset
    # the condition change is one Warning Event about the InferenceService, for the three conditions
    (event,) = await eventually_events(kapi, "InsufficientGPU")
    assert event["type"] == "Warning" and event["count"] == 1
    assert event["message"] == ("Ready=False, Progressing=True, Degraded=True: pod qwen-abc cannot be scheduled: "
                                "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    assert event["involvedObject"] == {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                                       "name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen"}
    assert event["firstTimestamp"].endswith("Z") and "T" in event["firstTimestamp"]


async def test_a_flapping_condition_raises_the_count_of_one_event(operator: Any, kapi: Any) -> None:
    await created(operator, kapi)
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    for _ in range(3):   # the pod comes and goes: InsufficientGPU, then not, three times
        await kapi.create(pods, unschedulable_pod())
        await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
        await kapi.delete(f"{pods}/qwen-abc")
        await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "False")
    (event,) = await eventually_events(kapi, "InsufficientGPU", lambda found: found[0]["count"] == 3)
    (recovered,) = await eventually_events(kapi, "AsExpected", lambda found: found[0]["count"] == 3)
    assert recovered["type"] == "Normal" and recovered["message"] == "Degraded=False: no problems observed"
    repeats = [r for r in write_requests(operator) if r.resource is not None and r.resource.plural == "events"
               and r.method.value == "PATCH"]
    assert {r.data["count"] for r in repeats} == {2, 3}


async def test_bad_spec_the_schema_cannot_catch_becomes_a_condition(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(resources={"memory": "lots"}))
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["reason"] == "InvalidSpec"
    assert "resources.memory 'lots' is not a Kubernetes quantity" in condition(obj, "Degraded")["message"]
    assert condition(obj, "Ready")["status"] == "False"
    (event,) = await eventually_events(kapi, "InvalidSpec")
    assert event["type"] == "Warning" and "resources.memory 'lots'" in event["message"]
    await settle(operator)
    assert await kapi.get(DEPLOYMENT) is None
    # one message: the operator's Event, not also kopf's "failed permanently" one
    items = (await kapi.get(EVENTS) or {}).get("items") or []
    assert [e["reason"] for e in items] == ["InvalidSpec"], items
    # Fixing the spec recovers.
    await kapi.patch(ISVC, {"spec": {"resources": {"memory": "2Gi"}}})
    await kapi.eventually(DEPLOYMENT, lambda d: True)
    await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("reason") != "InvalidSpec")


async def test_a_flag_the_operator_owns_is_reported_when_the_schema_was_skipped(operator: Any, kapi: Any) -> None:
    # A real API server refuses it at apply time (tests/e2e/test_kubectl.py); an emulator lets it through.
    await kapi.create(isvc_path(NAMESPACE), manifest(runtime={"extraArgs": ["--port=9000"]}))
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["reason"] == "InvalidSpec"
    assert "spec.runtime.extraArgs" in condition(obj, "Degraded")["message"]
    assert "--port" in condition(obj, "Degraded")["message"]


async def test_invalid_spec_that_skipped_the_schema_is_reported(operator: Any, kapi: Any) -> None:
    # An emulator (or a cluster with an old CRD) lets a spec through that CEL would refuse.
    await kapi.create(isvc_path(NAMESPACE), manifest(parallelism={"tensor": 3}))
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
    assert "power of two" in condition(obj, "Degraded")["message"]
    assert "spec.parallelism.tensor" in condition(obj, "Degraded")["message"]


async def test_service_monitor_applied_when_its_crd_exists(cluster: Any, kapi: Any) -> None:
    cluster.resources["monitoring.coreos.com/v1/servicemonitors"] = kmock_lib.ResourceInfo(
        kind="ServiceMonitor", namespaced=True, verbs={"get", "list", "create", "patch"})
    config = OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True, service_monitor="auto")
    async with running_operator(cluster, config):
        await kapi.create(isvc_path(NAMESPACE), manifest())
        sm = await kapi.eventually(child_path("ServiceMonitor", NAMESPACE, NAME), lambda s: True)
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["metadata"]["ownerReferences"][0]["uid"] == "uid-qwen"


async def test_every_request_the_operator_makes_is_allowed_by_its_rbac(operator: Any, kapi: Any) -> None:
    await created(operator, kapi, replicas=2)
    await kapi.patch(ISVC, {"spec": {"replicas": 3}})
    await kapi.delete(DEPLOYMENT)
    await kapi.eventually(DEPLOYMENT, lambda d: d["spec"]["replicas"] == 3)
    await settle(operator)
    checked = rbac_checked_requests(operator)
    assert ("apps", "deployments", "create") in checked or ("apps", "deployments", "patch") in checked
    assert ("kubeinfer.dev", "inferenceservices/status", "patch") in checked
