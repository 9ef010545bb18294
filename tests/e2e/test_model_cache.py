"""The node-local model cache on a real node: an hf:// InferenceService of 2 replicas with
`model.cacheHostPath`, downloading from a stand-in Hub that runs in a pod of the cluster (tests/support/
hub_standin.py serving the demo model baked in the runtime image; `HF_ENDPOINT` reaches the init containers
through `model.credentialsSecret`). Both replicas start together on one node: each file is downloaded once,
both serve; a deleted pod's replacement downloads nothing.

Needs KUBEINFER_E2E_NODE_CACHE_DIR: a directory on every node that uid 1000 can write (the local cluster:
`install -d -o 1000 -g 1000 DIR` on this machine; kind: the same through `docker exec` on its node). A
directory the kubelet creates is root's, and the init container then exits with the one-line error that
tests/operator/test_model_cache.py checks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import streams
from support.cluster import (
    OperatorProcess, eventually, isvc_path, namespace_scene, pods_of, ready_pods, service_url, start_operator,
)

NODE_CACHE_DIR = os.environ.get("KUBEINFER_E2E_NODE_CACHE_DIR")
NAME = "cached"
HUB_PORT = 8080
STANDIN = Path(__file__).resolve().parents[1] / "support" / "hub_standin.py"
pytestmark = pytest.mark.skipif(not NODE_CACHE_DIR, reason="KUBEINFER_E2E_NODE_CACHE_DIR is not set: a node "
                                                            "directory uid 1000 can write (see this file)")


@pytest.fixture(scope="module")
def hub(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    with namespace_scene(kube) as (ns, stack):
        yield from _hub(kube, ns, stack, runtime_image, tmp_path_factory)


def _hub(kube: Any, ns: str, stack: Any, runtime_image: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    base = f"/api/v1/namespaces/{ns}"
    kube.request("POST", f"{base}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hub-standin"},
        "data": {"hub_standin.py": STANDIN.read_text()}})
    kube.request("POST", f"{base}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hub", "labels": {"app": "hub"}},
        "spec": {"containers": [{
            "name": "hub", "image": runtime_image, "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "/standin/hub_standin.py", "org/demo", "/opt/kubeinfer/models/demo", str(HUB_PORT)],
            "volumeMounts": [{"name": "standin", "mountPath": "/standin"}],
            "readinessProbe": {"tcpSocket": {"port": HUB_PORT}, "periodSeconds": 1}}],
            "volumes": [{"name": "standin", "configMap": {"name": "hub-standin"}}]}})
    pod = eventually(lambda: (p := kube.get(f"{base}/pods/hub")) and p["status"].get("podIP")
                     and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                     and p, 120, "the stand-in Hub pod Ready")
    url = f"http://{pod['status']['podIP']}:{HUB_PORT}"
    kube.request("POST", f"{base}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hub"}, "stringData": {"HF_ENDPOINT": url}})
    start_operator(stack, kube, OperatorProcess(ns, tmp_path_factory.mktemp("cache") / "operator.log",
                                                image=runtime_image))
    yield ns, url


def downloads(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/_downloads", timeout=5).json()


def test_replicas_on_one_node_download_once_and_a_replacement_downloads_nothing(
        kube: Any, hub: tuple, timings: dict[str, float]) -> None:
    ns, url = hub
    # A revision of its own per run: the node's cache outlives the namespace.
    uri = f"hf://org/demo@{ns}"
    started = time.monotonic()
    kube.apply({"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": NAME, "namespace": ns},
                "spec": {"model": {"uri": uri, "cacheHostPath": NODE_CACHE_DIR, "credentialsSecret": "hub"},
                         "runtime": {"imagePullPolicy": "IfNotPresent", "maxNumSeqs": 4, "maxModelLen": 1024},
                         "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "replicas": 2}})
    eventually(lambda: len(ready_pods(kube, ns, NAME)) == 2, 240, "both replicas Ready")
    timings["node cache: apply -> 2 replicas Ready (one hf download between them)"] = time.monotonic() - started
    files = downloads(url)
    assert files and set(files.values()) == {1}, files   # every file once, for two pods
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    nodes = {p["spec"]["nodeName"] for p in pods_of(kube, ns, NAME)}
    result = streams.stream_completion(streams.client(service_url(kube, ns, NAME)), NAME, "Kubernetes is", 8)
    assert result.whole(8)

    victim = ready_pods(kube, ns, NAME)[0]["metadata"]["name"]
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{victim}")
    started = time.monotonic()
    eventually(lambda: len([p for p in ready_pods(kube, ns, NAME) if p["metadata"]["name"] != victim]) == 2, 240,
               "a replacement Ready")
    timings["node cache: pod deleted -> replacement Ready (cache hit)"] = time.monotonic() - started
    if {p["spec"]["nodeName"] for p in pods_of(kube, ns, NAME)} <= nodes:
        assert downloads(url) == files   # same node: nothing downloaded again
    assert kube.get(isvc_path(ns, NAME))["spec"]["model"]["cacheHostPath"] == NODE_CACHE_DIR
