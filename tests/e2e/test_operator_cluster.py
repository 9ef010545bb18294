"""The operator's API semantics on a real API server (skipped unless KUBEINFER_E2E_KUBECONFIG is set).

Applies crds/ first, runs the operator in-process against a fresh namespace, and checks what kmock
cannot: CEL refusals, server-side apply, pruning of undeclared status fields, the scale subresource,
resourceVersions that do not move on a no-op resync. Pods need not run: a cluster without GPUs
shows them Unschedulable, which the status must explain.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support import cluster
from support.cluster import condition, eventually, start_operator_in_process

NAME = "qwen"
ACTIONABLE = {"InsufficientGPU", "Unschedulable", "ImagePullFailed", "CrashLoop", "ContainerConfigError",
              "LoadingModel", "Available", "Complete", "AsExpected", "NoReplicasReady", "RollingOut", "Creating"}


def run_operator(namespace: str) -> tuple[threading.Thread, threading.Event]:
    thread, stop = start_operator_in_process(namespace, service_monitor="auto")
    time.sleep(2)  # let the watch streams open
    return thread, stop


@pytest.fixture()
def operator(namespace: str) -> Iterator[str]:
    thread, stop = run_operator(namespace)
    yield namespace
    stop.set()
    thread.join(30)


def isvc_path(ns: str, name: str = NAME) -> str:
    return cluster.isvc_path(ns, name)


def manifest(ns: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": {"model": {"uri": "pvc://models/qwen"}, **spec}}


def create(kube: Any, ns: str, **spec: Any) -> dict[str, Any]:
    return kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices",
                        body=manifest(ns, **spec))


@pytest.mark.parametrize("spec, message", [
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not exceed"),
    ({"parallelism": {"tensor": 3}}, "power of two"),
    ({"model": {"uri": "ftp://host/m"}}, "hf://, pvc://, s3:// or file://"),
    ({"replicas": 9, "autoscaling": {"maxReplicas": 4}}, "spec.replicas must lie within"),
    ({"resources": {"gpus": 2}},
     "resources.gpus must be 0 (run on CPU) or equal the larger of parallelism.tensor and parallelism.expert"),
    ({"resources": {"gpus": 0, "gpuProduct": "NVIDIA-L4"}}, "resources.gpuProduct needs GPUs"),
    ({"resources": {"gpus": 0}, "runtime": {"gpuMemoryUtilization": 0.5}}, "gpuMemoryUtilization applies to GPUs"),
    ({"runtime": {"speculative": {"method": "ngram", "ngramMin": 5}}}, "ngramMin must not exceed"),
    ({"runtime": {"speculative": {"method": "eagle"}}}, "spec.runtime.speculative.method: Unsupported value"),
    ({"runtime": {"speculative": {"method": "draft"}}}, "draftModelPath is needed with method draft"),
    ({"parallelism": {"tensor": 2}, "runtime": {"speculative": {"method": "draft", "draftModelPath": "/m"}}},
     "method draft runs with parallelism.tensor 1 only"),
    ({"router": {"replicas": 0}}, "spec.router.replicas: Invalid value"),
    ({"router": {"policy": "random"}}, "spec.router.policy: Unsupported value"),
    ({"router": {"queueTimeoutSeconds": 0}}, "spec.router.queueTimeoutSeconds: Invalid value"),
    ({"router": {"loadWeight": -1}}, "spec.router.loadWeight: Invalid value"),
    ({"inferencePool": {"endpointPickerPort": 9002}}, "spec.inferencePool.endpointPicker: Required value"),
    ({"model": {"uri": "hf://o/m", "cacheHostPath": "/c", "cacheVolumeClaim": "c"}},
     "model.cacheHostPath and model.cacheVolumeClaim are exclusive"),
    ({"model": {"uri": "pvc://c/m", "cacheHostPath": "/c"}}, "it applies to hf:// and s3:// models only"),
    ({"model": {"uri": "hf://o/m", "cacheHostPath": "relative/dir"}}, "should match '^/'"),
    ({"runtime": {"compileCache": {"hostPath": "/c", "volumeClaim": "k"}}},
     "runtime.compileCache.hostPath and runtime.compileCache.volumeClaim are exclusive"),
    ({"runtime": {"extraArgs": ["--port", "9000"]}}, "runtime.extraArgs must not set --model"),
    ({"runtime": {"env": [{"name": "KUBEINFER_DEVICE", "value": "cuda"}]}}, "runtime.env must not set KUBEINFER_MODEL"),
    ({"tenants": {"secretRef": {"name": "t"}}, "apiKeySecretRef": {"name": "k"}},
     "tenants.secretRef and apiKeySecretRef both name the API keys' Secret: give one"),
    ({"tenants": {"secretRef": {"name": "t"}}, "runtime": {"schedulingPolicy": "shortest-first"}},
     "with spec.tenants the replicas' waiting queue follows tenants.schedulingPolicy"),
    ({"tenants": {"secretRef": {"name": "t"}, "maxInFlightPerTenant": 2}},
     "tenants.maxInFlightPerTenant is enforced by the router"),
    ({"tenants": {"secretRef": {"name": "t"}, "maxInFlightPerTenant": 2}, "router": {"maxInFlightPerTenant": 3}},
     "set maxInFlightPerTenant once"),
    ({"tenants": {"schedulingPolicy": "fair"}}, "spec.tenants.secretRef: Required value"),
])
def test_api_server_refuses_bad_specs(kube: Any, namespace: str, spec: dict[str, Any], message: str) -> None:
    from kubernetes.client import ApiException
    with pytest.raises(ApiException) as info:
        create(kube, namespace, **spec)
    assert info.value.status == 422
    assert message in (info.value.body or "")


def test_api_server_accepts_tenants_beside_the_runtime_policys_default(kube: Any, namespace: str) -> None:
    """The schema's default runtime.schedulingPolicy (fcfs) does not trip the one-policy rule; tenants' own
    defaults (fair, the Secret's key, tenant-isolated prefix caches) are filled in by the API server."""
    made = create(kube, namespace, runtime={"maxNumSeqs": 8}, router={},
                  tenants={"secretRef": {"name": "t"}, "maxInFlightPerTenant": 2})
    assert made["spec"]["runtime"]["schedulingPolicy"] == "fcfs"
    assert made["spec"]["tenants"] == {"secretRef": {"name": "t", "key": "api-keys"}, "schedulingPolicy": "fair",
                                       "maxInFlightPerTenant": 2, "prefixCacheSharing": "tenant"}


def test_lifecycle(kube: Any, operator: str) -> None:
    ns = operator
    owner = create(kube, ns, parallelism={"tensor": 2}, replicas=1)
    dep_path = f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}"
    dep = eventually(lambda: kube.get(dep_path), what="Deployment")
    for path in (dep_path, f"/api/v1/namespaces/{ns}/services/{NAME}",
                 f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{NAME}"):
        child = eventually(lambda: kube.get(path), what=path)
        assert child["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    managers = {m["manager"] for m in dep["metadata"]["managedFields"] if m["operation"] == "Apply"}
    assert "kubeinfer-operator" in managers

    # Status fields survive the API server's pruning, and pods that cannot start are explained.
    obj = eventually(lambda: (o := kube.get(isvc_path(ns))) and o.get("status", {}).get("selector") and o,
                     what="status")
    assert obj["status"]["endpoint"] == f"http://{NAME}.{ns}.svc/v1"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "Degraded")["reason"] in ACTIONABLE | {"InsufficientGPU"}

    # Spec update -> the Deployment is patched.
    kube.request("PATCH", isvc_path(ns), body={"spec": {"parallelism": {"tensor": 4}}},
                 content_type="application/merge-patch+json")
    eventually(lambda: kube.get(dep_path)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
               ["nvidia.com/gpu"] == "4", what="patched Deployment")

    # Scale subresource -> spec.replicas -> Deployment replicas.
    kube.request("PATCH", isvc_path(ns) + "/scale", body={"spec": {"replicas": 2}},
                 content_type="application/merge-patch+json")
    eventually(lambda: kube.get(dep_path)["spec"]["replicas"] == 2, what="scaled Deployment")

    # A hand edit is reverted; a deleted Deployment comes back.
    time.sleep(2)
    kube.request("PATCH", dep_path, body={"spec": {"revisionHistoryLimit": 9}}, content_type="application/merge-patch+json")
    eventually(lambda: kube.get(dep_path)["spec"]["revisionHistoryLimit"] == 3, what="reverted edit")
    old_uid = kube.get(dep_path)["metadata"]["uid"]
    kube.request("DELETE", dep_path)
    eventually(lambda: (d := kube.get(dep_path)) and d["metadata"]["uid"] != old_uid, what="recreated Deployment")


def test_noop_resync_changes_nothing(kube: Any, operator: str) -> None:
    ns = operator
    create(kube, ns)
    dep_path = f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}"
    eventually(lambda: kube.get(dep_path), what="Deployment")
    time.sleep(5)  # let the pods' first status changes pass
    paths = [dep_path, f"/api/v1/namespaces/{ns}/services/{NAME}",
             f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{NAME}"]
    before = {p: kube.get(p)["metadata"]["resourceVersion"] for p in paths}
    spec_version = kube.get(isvc_path(ns))["metadata"]["resourceVersion"]
    thread, stop = run_operator(ns)  # a second copy resumes the same object
    time.sleep(5)
    stop.set()
    thread.join(30)
    assert {p: kube.get(p)["metadata"]["resourceVersion"] for p in paths} == before
    # The InferenceService may only change if pod status changed meanwhile; its spec never.
    assert kube.get(isvc_path(ns))["metadata"]["generation"] == 1, spec_version


def test_bad_spec_the_schema_cannot_catch_becomes_a_condition(kube: Any, operator: str) -> None:
    ns = operator
    create(kube, ns, resources={"memory": "lots"})
    obj = eventually(lambda: (o := kube.get(isvc_path(ns))) and condition(o, "Degraded").get("reason") == "InvalidSpec"
                     and o, what="InvalidSpec condition")
    assert "resources.memory 'lots' is not a Kubernetes quantity" in condition(obj, "Degraded")["message"]
    assert kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}") is None


POOL_SCHEMA = {"openAPIV3Schema": {"type": "object", "properties": {
    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}
POOL_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferencepools.inference.networking.k8s.io", "labels": {"kubeinfer.dev/e2e": "stand-in"},
                 "annotations": {"api-approved.kubernetes.io": "unapproved, a test stand-in"}},
    "spec": {"group": "inference.networking.k8s.io", "scope": "Namespaced",
             "names": {"kind": "InferencePool", "plural": "inferencepools", "singular": "inferencepool"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": POOL_SCHEMA}]}}


@pytest.fixture()
def inference_pool_crd(kube: Any) -> Iterator[None]:
    """The InferencePool CRD: the cluster's own if it serves one, else a stand-in (v1, a free-form spec) that the
    test removes after itself."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{POOL_CRD['metadata']['name']}"
    ours = kube.get(path) is None
    if ours:
        kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=POOL_CRD)
    eventually(lambda: kube.has_api("inference.networking.k8s.io/v1", "inferencepools"), what="InferencePool served")
    yield
    if ours:
        kube.request("DELETE", path)


def test_router_and_inference_pool_on_a_real_api_server(kube: Any, inference_pool_crd: None, operator: str) -> None:
    ns = operator
    owner = create(kube, ns, router={"replicas": 1}, inferencePool={"endpointPicker": "llm-d-epp"})
    paths = {"Deployment": f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}-router",
             "Service": f"/api/v1/namespaces/{ns}/services/{NAME}-router",
             "InferencePool": f"/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{NAME}"}
    for kind, path in paths.items():
        child = eventually(lambda: kube.get(path), what=kind)
        assert child["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        assert "kubeinfer-operator" in {m["manager"] for m in child["metadata"]["managedFields"]
                                        if m["operation"] == "Apply"}, kind
    pool = kube.get(paths["InferencePool"])
    assert pool["spec"]["selector"] == {"matchLabels": {"kubeinfer.dev/inferenceservice": NAME}}
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-d-epp"
    obj = kube.get(isvc_path(ns))
    assert obj["spec"]["router"]["loadWeight"] == 0.5   # the API server filled in the schema's defaults
    eventually(lambda: kube.get(isvc_path(ns))["status"].get("endpoint") == f"http://{NAME}-router.{ns}.svc/v1",
               what="status.endpoint naming the router")
    # The router pod (it need not run) is told there is no ready replica yet: known and empty.
    router_pod = eventually(lambda: next((p for p in kube.list(f"/api/v1/namespaces/{ns}/pods",
                                                               f"kubeinfer.dev/router={NAME}")
                                          if (p["metadata"].get("annotations") or {})
                                          .get("kubeinfer.dev/router-endpoints") == "[]"), None),
                            what="the router pod's endpoints annotation")
    assert "kubeinfer.dev/inferenceservice" not in router_pod["metadata"]["labels"]
    time.sleep(3)
    before = {p: kube.get(p)["metadata"]["resourceVersion"] for p in paths.values()}
    pod_path = f"/api/v1/namespaces/{ns}/pods/{router_pod['metadata']['name']}"
    annotation_before = kube.get(pod_path)["metadata"]["annotations"]
    thread, stop = run_operator(ns)  # a second copy resumes the same object: nothing to write
    time.sleep(5)
    stop.set()
    thread.join(30)
    assert {p: kube.get(p)["metadata"]["resourceVersion"] for p in paths.values()} == before
    assert kube.get(pod_path)["metadata"]["annotations"] == annotation_before
    # Both turned off: deleted.
    kube.request("PATCH", isvc_path(ns), body={"spec": {"router": {"enabled": False}, "inferencePool": None}},
                 content_type="application/merge-patch+json")
    for kind, path in paths.items():
        eventually(lambda: kube.get(path) is None, 60, f"{kind} deleted")
