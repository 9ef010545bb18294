"""The operator reconciling `spec.disaggregation` against kmock: the two pools' Deployments and their flags, the
router told each pool, the status of each pool, the children that no longer belong deleted when it is turned on or
off, and specs refused. The autoscaler's side: test_disaggregation_autoscaler_kmock.py; the CEL rules on a real API
server: tests/e2e/test_kubectl.py; the measurements: tests/e2e/test_disaggregation_cluster.py.
"""

from __future__ import annotations

import json
from typing import Any

from kubeinfer.operator.reconcile import pools, router
from kubeinfer.operator.reconcile.builders import INSTANCE_LABEL

from support.manifests import condition, isvc_manifest
from support.operator_harness import NAMESPACE, child_path, isvc_path, rbac_checked_requests, settle

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
COLOCATED = child_path("Deployment", NAMESPACE, NAME)
PREFILL = child_path("Deployment", NAMESPACE, f"{NAME}-prefill")
DECODE = child_path("Deployment", NAMESPACE, f"{NAME}-decode")
ROUTER = child_path("Deployment", NAMESPACE, f"{NAME}-router")
POOLS = {"prefill": {"replicas": 2, "resources": {"gpus": 0, "cpu": 4, "memory": "16Gi"}}, "decode": {"replicas": 3}}


def manifest(**spec: Any) -> dict[str, Any]:
    return isvc_manifest(NAME, NAMESPACE, "uid-qwen", **spec)


def pool_pod(role: str, i: int, ready: bool, ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-{role}-{i}", "namespace": NAMESPACE,
                         "labels": {INSTANCE_LABEL: NAME, pools.POOL_LABEL: role,
                                    "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def router_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-router-0", "namespace": NAMESPACE,
                         "labels": {router.ROUTER_LABEL: NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Pending"}}


def args_of(deployment: dict[str, Any]) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


async def test_two_pools_are_made_with_their_roles_and_the_router_gets_the_prefill_pool(
        operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(router={}, disaggregation={"kvPort": 9200, **POOLS}))
    prefill = await kapi.eventually(PREFILL, lambda d: True)
    decode = await kapi.eventually(DECODE, lambda d: True)
    route = await kapi.eventually(ROUTER, lambda d: True)
    await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("disaggregation"))
    assert await kapi.get(COLOCATED) is None   # never made: the pools replace it
    for dep, role, replicas in ((prefill, "prefill", 2), (decode, "decode", 3)):
        assert dep["spec"]["replicas"] == replicas
        assert dep["metadata"]["ownerReferences"][0]["uid"] == "uid-qwen"
        selector = {INSTANCE_LABEL: NAME, pools.POOL_LABEL: role}
        assert dep["spec"]["selector"]["matchLabels"] == selector
        assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        assert flag(args_of(dep), "--kv-role") == role
    assert flag(args_of(prefill), "--kv-port") == "9200" and "--kv-port" not in args_of(decode)
    assert "--kv-source-networks" not in args_of(decode)   # no KUBEINFER_POD_NETWORKS: the runtime's default
    prefill_container = prefill["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "kv", "containerPort": 9200, "protocol": "TCP"} in prefill_container["ports"]
    # Each pool's own resources: CPU for prefill, the service's (one GPU) for decode.
    assert flag(args_of(prefill), "--device") == "cpu" and "--device" not in args_of(decode)
    assert prefill_container["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert decode["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    # The Service NAME (the bypass, what the ServiceMonitor scrapes) selects both pools.
    service = await kapi.get(child_path("Service", NAMESPACE, NAME))
    assert service["spec"]["selector"] == {INSTANCE_LABEL: NAME}
    router_args = args_of(route)
    assert flag(router_args, "--prefill-endpoints-file") == router.PREFILL_ENDPOINTS_FILE
    assert flag(router_args, "--endpoints-file") == router.ENDPOINTS_FILE
    [volume] = route["spec"]["template"]["spec"]["volumes"]
    assert {item["path"]: item["fieldRef"]["fieldPath"] for item in volume["downwardAPI"]["items"]} == {
        "endpoints": f"metadata.annotations['{router.ENDPOINTS_ANNOTATION}']",
        "prefill-endpoints": f"metadata.annotations['{router.PREFILL_ENDPOINTS_ANNOTATION}']"}


async def test_router_pods_get_each_pools_ready_replicas(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(router={}, disaggregation=POOLS))
    await kapi.eventually(ROUTER, lambda d: True)
    await kapi.create(PODS, pool_pod("prefill", 0, True, "10.0.0.1"))
    await kapi.create(PODS, pool_pod("prefill", 1, False, "10.0.0.2"))   # loading: not listed
    await kapi.create(PODS, pool_pod("decode", 0, True, "10.0.1.1"))
    await kapi.create(PODS, router_pod())

    def lists(p: dict[str, Any]) -> tuple[Any, Any]:
        notes = p["metadata"].get("annotations") or {}
        return tuple(json.loads(notes[a]) if a in notes else None
                     for a in (router.ENDPOINTS_ANNOTATION, router.PREFILL_ENDPOINTS_ANNOTATION))
    await kapi.eventually(f"{PODS}/{NAME}-router-0",
                          lambda p: lists(p) == (["http://10.0.1.1:8000"], ["http://10.0.0.1:8000"]))
    await kapi.patch(f"{PODS}/{NAME}-prefill-1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    await kapi.eventually(f"{PODS}/{NAME}-router-0", lambda p: lists(p) == (
        ["http://10.0.1.1:8000"], ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]))


async def test_status_reports_each_pool_and_says_which_is_not_ready(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(router={}, disaggregation=POOLS))
    await kapi.eventually(DECODE, lambda d: True)
    obj = await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("disaggregation"))
    st = obj["status"]
    assert st["disaggregation"]["prefill"] == {"replicas": 0, "readyReplicas": 0, "updatedReplicas": 0,
                                               "desiredReplicas": 2}
    assert st["disaggregation"]["decode"]["desiredReplicas"] == 3 and st["desiredReplicas"] == 5
    assert condition(obj, "Ready")["status"] == "False"
    # The decode pool serves: Ready, but the STATUS says the prefill pool has nothing ready yet.
    await kapi.patch(DECODE, {"status": {"replicas": 3, "updatedReplicas": 3, "readyReplicas": 3}})
    obj = await kapi.eventually(ISVC, lambda o: o["status"]["disaggregation"]["decode"]["readyReplicas"] == 3)
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "PrefillNotReady")
    assert "prefill pool: 0/2 replicas updated, 0/2 replicas ready" in ready["message"] and \
        "decode pool: 3/3 replicas ready" in ready["message"]
    progressing = condition(obj, "Progressing")
    assert progressing["status"] == "True" and progressing["message"].startswith("prefill pool: ")
    assert "decode pool" not in progressing["message"]
    await kapi.patch(PREFILL, {"status": {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}})
    obj = await kapi.eventually(ISVC, lambda o: o["status"]["readyReplicas"] == 5)
    assert (condition(obj, "Ready")["reason"], condition(obj, "Progressing")["status"]) == ("Available", "False")
    assert obj["status"]["disaggregation"]["prefill"]["readyReplicas"] == 2
    # A pod of one pool that cannot be scheduled: Degraded names that pool.
    unschedulable = pool_pod("prefill", 0, False, "10.0.0.1")
    unschedulable["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                              "message": "0/3 nodes are available: 3 Insufficient cpu."}]
    await kapi.create(PODS, unschedulable)
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["message"].startswith(f"prefill pool: pod {NAME}-prefill-0 cannot be scheduled")


async def test_turning_disaggregation_on_and_off_deletes_the_children_that_no_longer_belong(
        operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(router={}, replicas=2))
    await kapi.eventually(COLOCATED, lambda d: True)
    await kapi.patch(ISVC, {"metadata": {"generation": 2}, "spec": {"replicas": None, "disaggregation": POOLS}})
    await kapi.eventually(DECODE, lambda d: True)
    await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("disaggregation") and
                          o["status"].get("observedGeneration") == 2)
    assert await kapi.get(PREFILL) is not None
    assert await kapi.get(COLOCATED) is None
    await kapi.patch(ISVC, {"metadata": {"generation": 3}, "spec": {"disaggregation": None}})
    colocated = await kapi.eventually(COLOCATED, lambda d: True)
    obj = await kapi.eventually(ISVC, lambda o: o["status"].get("observedGeneration") == 3 and
                                "disaggregation" not in o["status"])
    assert await kapi.get(PREFILL) is None and await kapi.get(DECODE) is None
    assert "--kv-role" not in args_of(colocated) and obj["status"]["desiredReplicas"] == 1
    route = await kapi.eventually(ROUTER, lambda d: "--prefill-endpoints-file" not in args_of(d))
    assert len(route["spec"]["template"]["spec"]["volumes"][0]["downwardAPI"]["items"]) == 1
    await settle(operator)
    assert {("apps", "deployments", "delete")} <= rbac_checked_requests(operator)


async def test_a_pool_deployment_of_someone_else_is_not_deleted(operator: Any, kapi: Any) -> None:
    foreign = {"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": f"{NAME}-prefill", "namespace": NAMESPACE},
               "spec": {"selector": {"matchLabels": {"app": "other"}}, "template": {}}}
    await kapi.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", foreign)
    await kapi.create(isvc_path(NAMESPACE), manifest())
    await kapi.eventually(COLOCATED, lambda d: True)
    await settle(operator)
    assert await kapi.get(PREFILL) is not None


async def test_a_refused_spec_is_an_invalid_spec_condition_and_makes_no_pool(operator: Any, kapi: Any) -> None:
    """kmock runs no CEL: the operator's own check says the same words (tests/operator/test_crd.py)."""
    await kapi.create(isvc_path(NAMESPACE), manifest(disaggregation=POOLS))   # no router
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["reason"] == "InvalidSpec"
    assert "spec.disaggregation needs spec.router" in condition(obj, "Degraded")["message"]
    await settle(operator)
    assert await kapi.get(PREFILL) is None and await kapi.get(DECODE) is None and await kapi.get(COLOCATED) is None
