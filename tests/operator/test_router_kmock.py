"""The operator deploying `spec.router` against kmock: the router's Deployment and Service, the ready replicas
written into the router pods' annotation, the router turned off, bad router specs, the autoscaler reading the
router pods' waiting requests, and RBAC; and `spec.inferencePool`. The same on a real cluster:
tests/e2e/test_router_cluster.py and tests/e2e/test_operator_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmock_lib
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import router
from kubeinfer.operator.reconcile.builders import INSTANCE_LABEL
from kubeinfer.runtime.router.metrics import RouterMetrics

from support.manifests import condition, isvc_manifest
from support.operator_harness import (NAMESPACE, TEST_USER_AGENT, child_path, isvc_path, operator_requests,
                                      rbac_checked_requests, running_operator, settle, write_requests)

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
ROUTER_DEPLOYMENT = child_path("Deployment", NAMESPACE, f"{NAME}-router")
ROUTER_SERVICE = child_path("Service", NAMESPACE, f"{NAME}-router")
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def manifest(**spec: Any) -> dict[str, Any]:
    return isvc_manifest(NAME, NAMESPACE, "uid-qwen", **spec)


def replica_pod(i: int, ready: bool, ip: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-{i}", "namespace": NAMESPACE,
                         "labels": {INSTANCE_LABEL: NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", **({"podIP": ip} if ip else {}),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def router_pod(i: int, ip: str | None = None, ready: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-router-{i}", "namespace": NAMESPACE,
                         "labels": {router.ROUTER_LABEL: NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running" if ip else "Pending", **({"podIP": ip} if ip else {}),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def endpoints_of(pod: dict[str, Any] | None) -> list[str] | None:
    value = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(router.ENDPOINTS_ANNOTATION)
    return None if value is None else json.loads(value)


async def writes_settle(server: Any) -> None:
    """Wait until nothing has been written for 1 s (reads may go on: kmock replays pod events)."""
    await settle(server, quiet=1.0, requests=write_requests)


async def test_router_deployment_and_service_are_built_and_status_names_the_router(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(router={"replicas": 2, "loadWeight": 0.75}))
    dep = await kapi.eventually(ROUTER_DEPLOYMENT, lambda d: True)
    svc = await kapi.eventually(ROUTER_SERVICE, lambda s: True)
    obj = await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("endpoint"))
    assert obj["status"]["endpoint"] == "http://qwen-router.default.svc/v1"
    for child in (dep, svc):
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-qwen"
    assert dep["spec"]["replicas"] == 2
    template = dep["spec"]["template"]
    # The router's pods are not the replicas': the replicas' Service, PDB and Deployment must not select them.
    assert INSTANCE_LABEL not in template["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"] == {router.ROUTER_LABEL: NAME}
    container = template["spec"]["containers"][0]
    assert container["command"] == ["kubeinfer", "router"]
    args = container["args"]
    assert args[args.index("--endpoints-file") + 1] == router.ENDPOINTS_FILE
    assert args[args.index("--load-weight") + 1] == "0.75" and args[args.index("--policy") + 1] == "prefix"
    assert args[args.index("--served-model-name") + 1] == NAME
    assert template["spec"]["automountServiceAccountToken"] is False   # no API access needed
    [volume] = template["spec"]["volumes"]
    assert volume["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == \
        f"metadata.annotations['{router.ENDPOINTS_ANNOTATION}']"
    replicas_svc = await kapi.get(child_path("Service", NAMESPACE, NAME))
    assert replicas_svc["spec"]["selector"] == {INSTANCE_LABEL: NAME}   # the bypass is still there


async def test_ready_replicas_are_written_to_every_router_pod_and_an_unrelated_event_writes_nothing(
        operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(replicas=3, router={}))
    await kapi.eventually(ROUTER_DEPLOYMENT, lambda d: True)
    # kopf's own bookkeeping of the create handler is done (a late write of it is not a resync's).
    await kapi.eventually(ISVC, lambda o: "kubeinfer.dev/last-handled-configuration" in o["metadata"].get(
        "annotations", {}), timeout=15)
    await kapi.create(PODS, replica_pod(0, ready=True, ip="10.0.0.1"))
    await kapi.create(PODS, replica_pod(1, ready=False, ip="10.0.0.2"))   # loading its model
    await kapi.create(PODS, replica_pod(2, ready=True))                   # no IP yet
    await kapi.create(PODS, router_pod(0))                                # Pending: written all the same
    pod0 = await kapi.eventually(f"{PODS}/{NAME}-router-0", lambda p: endpoints_of(p) == ["http://10.0.0.1:8000"])
    writes = [r for r in write_requests(operator) if r.resource is not None and r.resource.plural == "pods"
              and r.headers.get("User-Agent") != TEST_USER_AGENT]
    one = {"metadata": {"annotations": {router.ENDPOINTS_ANNOTATION: '["http://10.0.0.1:8000"]'}}}
    assert writes and all(r.data == one and r.headers["Content-Type"] == "application/merge-patch+json"
                          for r in writes), writes
    # A second replica turns Ready; a second router pod appears: both pods get both replicas.
    await kapi.patch(f"{PODS}/{NAME}-1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    await kapi.create(PODS, router_pod(1, ip="10.0.1.1"))
    both = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    for i in (0, 1):
        await kapi.eventually(f"{PODS}/{NAME}-router-{i}", lambda p: endpoints_of(p) == both)
    # A replica turning unready leaves the list (one being deleted too: tests/operator/test_router_builders.py).
    await kapi.patch(f"{PODS}/{NAME}-0", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    await kapi.eventually(f"{PODS}/{NAME}-router-1", lambda p: endpoints_of(p) == ["http://10.0.0.2:8000"])
    await writes_settle(operator)
    # An event that leaves the ready set as it is (a pass runs, reads the router pods) writes nothing. (A second
    # operator resuming everything writes nothing either: on a real API server, tests/e2e/test_operator_cluster.py.)
    start = len(list(operator))
    await kapi.patch(f"{PODS}/{NAME}-2", {"metadata": {"annotations": {"example.com/note": "hi"}}})
    await writes_settle(operator)
    looked = [r for r in list(operator)[start:] if r.method.value == "GET" and "kubeinfer.dev%2Frouter" in str(r.url)]
    assert looked, "the pod event never led to a pass"
    ours = [r for r in write_requests(operator, start) if r.headers.get("User-Agent") != TEST_USER_AGENT]
    assert ours == [], [(r.url, r.data) for r in ours]
    assert pod0["metadata"]["labels"] == router_pod(0)["metadata"]["labels"]


async def test_router_turned_off_is_deleted_and_the_endpoint_goes_back(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(router={}))
    await kapi.eventually(ROUTER_SERVICE, lambda s: True)
    await kapi.patch(ISVC, {"metadata": {"generation": 2}, "spec": {"router": {"enabled": False}}})
    obj = await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("endpoint") == "http://qwen.default.svc/v1")
    assert await kapi.get(ROUTER_DEPLOYMENT) is None and await kapi.get(ROUTER_SERVICE) is None
    assert condition(obj, "Degraded").get("reason") != "InvalidSpec"
    await kapi.patch(ISVC, {"metadata": {"generation": 3}, "spec": {"router": {"enabled": True}}})
    await kapi.eventually(ROUTER_DEPLOYMENT, lambda d: True)


async def test_a_router_of_someone_else_is_not_deleted(operator: Any, kapi: Any) -> None:
    foreign = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{NAME}-router", "namespace": NAMESPACE},
               "spec": {"ports": [{"port": 80}]}}
    await kapi.create(f"/api/v1/namespaces/{NAMESPACE}/services", foreign)
    await kapi.create(isvc_path(NAMESPACE), manifest())
    await kapi.eventually(ISVC, lambda o: condition(o, "Progressing"))
    await settle(operator)
    assert await kapi.get(ROUTER_SERVICE) is not None


@pytest.mark.parametrize("router_spec, name, message", [
    ({"cpu": "lots"}, NAME, "router.cpu 'lots' is not a Kubernetes quantity"),
    ({"memory": "0"}, NAME, "router.memory must be above zero"),
    ({}, "m" * 57, "the InferenceService's name may have at most 56 with spec.router"),
])
async def test_bad_router_spec_is_an_invalid_spec_condition(operator: Any, kapi: Any, router_spec: dict[str, Any],
                                                            name: str, message: str) -> None:
    body = manifest(router=router_spec)
    body["metadata"]["name"] = name
    await kapi.create(isvc_path(NAMESPACE), body)
    obj = await kapi.eventually(isvc_path(NAMESPACE, name), lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["reason"] == "InvalidSpec"
    assert message in condition(obj, "Degraded")["message"]
    await settle(operator)
    assert await kapi.get(child_path("Deployment", NAMESPACE, f"{name}-router")) is None


@pytest.fixture()
async def router_metrics(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RouterMetrics]:
    """A router's /metrics on 127.0.0.1 at the port the autoscaler scrapes router pods on."""
    metrics = RouterMetrics()

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")
    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    monkeypatch.setattr(router, "PORT", site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    try:
        yield metrics
    finally:
        await runner.cleanup()


async def test_requests_waiting_at_the_router_pods_scale_from_zero_without_router_metrics_url(
        cluster: Any, kapi: Any, router_metrics: RouterMetrics) -> None:
    config = OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True, service_monitor="never",
                            autoscale_interval_seconds=0.2)
    scaling = {"minReplicas": 0, "maxReplicas": 2, "initialDelaySeconds": 0}
    async with running_operator(cluster, config):
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=0, router={}, autoscaling=scaling))
        await kapi.create(PODS, router_pod(0, ip="127.0.0.1", ready=True))
        await asyncio.sleep(1.0)   # several passes with nobody waiting: zero stays zero
        assert (await kapi.get(ISVC))["spec"]["replicas"] == 0
        router_metrics.queue_requests.set(1)
        obj = await kapi.eventually(ISVC, lambda o: o["spec"]["replicas"] == 1)
        assert obj["status"]["lastSignals"]["reason"] == "ScaleFromZero"
        status, _ = await kapi.call("DELETE", ISVC)   # releases kopf's finalizer while the operator runs
        assert status == 200
        await kapi.gone(ISVC)
    scrapes = [r for r in operator_requests(cluster) if r.resource is not None and r.resource.plural == "pods"]
    assert scrapes, "the autoscaler never listed the router pods"


async def test_every_request_of_the_router_lifecycle_is_allowed_by_rbac(operator: Any, kapi: Any) -> None:
    operator.resources["inference.networking.k8s.io/v1/inferencepools"] = kmock_lib.ResourceInfo(
        kind="InferencePool", namespaced=True, verbs={"get", "list", "create", "patch", "delete"})
    await kapi.create(isvc_path(NAMESPACE), manifest(router={}))
    await kapi.eventually(ROUTER_DEPLOYMENT, lambda d: True)
    await kapi.create(PODS, replica_pod(0, ready=True, ip="10.0.0.1"))
    await kapi.create(PODS, router_pod(0))
    await kapi.eventually(f"{PODS}/{NAME}-router-0", lambda p: endpoints_of(p) == ["http://10.0.0.1:8000"])
    await kapi.patch(ISVC, {"spec": {"router": {"enabled": False}}})
    await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("endpoint") == "http://qwen.default.svc/v1")
    await settle(operator)
    await kapi.patch(ISVC, {"spec": {"inferencePool": {"endpointPicker": "epp"}}})
    await kapi.eventually(POOL, lambda p: True)
    await kapi.patch(ISVC, {"spec": {"inferencePool": None}})
    await kapi.gone(POOL)
    await settle(operator)
    checked = rbac_checked_requests(operator)
    assert {("", "pods", "patch"), ("apps", "deployments", "delete"), ("", "services", "delete"),
            ("inference.networking.k8s.io", "inferencepools", "create"),
            ("inference.networking.k8s.io", "inferencepools", "delete")} <= checked


POOL = f"/apis/inference.networking.k8s.io/v1/namespaces/{NAMESPACE}/inferencepools/{NAME}"


async def test_inference_pool_is_made_when_its_crd_is_served_and_deleted_when_removed(cluster: Any, kapi: Any) -> None:
    cluster.resources["inference.networking.k8s.io/v1/inferencepools"] = kmock_lib.ResourceInfo(
        kind="InferencePool", namespaced=True, verbs={"get", "list", "create", "patch", "delete"})
    async with running_operator(cluster):
        await kapi.create(isvc_path(NAMESPACE), manifest(inferencePool={"endpointPicker": "llm-d-epp"}))
        pool = await kapi.eventually(POOL, lambda p: True)
        assert pool["spec"] == {"selector": {"matchLabels": {INSTANCE_LABEL: NAME}}, "targetPorts": [{"number": 8000}],
                                "endpointPickerRef": {"group": "", "kind": "Service", "name": "llm-d-epp",
                                                      "port": {"number": 9002}, "failureMode": "FailClose"}}
        assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-qwen"
        deployment = await kapi.get(child_path("Deployment", NAMESPACE, NAME))
        assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        await kapi.patch(ISVC, {"metadata": {"generation": 2}, "spec": {"inferencePool": None}})
        await kapi.gone(POOL, "the InferencePool was not deleted")


async def test_inference_pool_without_its_crd_reconciles_the_rest_and_says_what_to_install(
        operator: Any, kapi: Any, caplog: pytest.LogCaptureFixture) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(inferencePool={"endpointPicker": "llm-d-epp"}))
    await kapi.eventually(child_path("Deployment", NAMESPACE, NAME), lambda d: True)
    await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("endpoint"))

    def said() -> list[logging.LogRecord]:   # kopf's error line, which `kubeinfer operator` also posts as an Event
        return [r for r in caplog.records if r.levelno >= logging.ERROR and "Gateway API Inference Extension" in
                r.getMessage() and "inferencepools.inference.networking.k8s.io" in r.getMessage()]
    deadline = asyncio.get_running_loop().time() + 30   # bounds a line that never comes, as kapi.eventually
    while not said():
        assert asyncio.get_running_loop().time() < deadline, "nothing says the CRD is missing"
        await asyncio.sleep(0.05)
    assert "failed temporarily" in said()[0].getMessage()   # retried: the pool is made once the CRD is there
    assert not [r for r in operator_requests(operator) if "inferencepools" in str(r.url) and r.method.value != "GET"]
