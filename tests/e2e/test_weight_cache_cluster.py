"""The node's weight cache on the real cluster (docs/runtime.md, "Weight cache"; issue #51): an InferenceService with
`runtime.compileCache.weights` deployed by the operator; its runtime container writes the model to the compile cache
volume, and the container the kubelet starts again in the same pod (the volume kept) loads it from there instead of
the checkpoint, and answers as the first one did.

Traffic goes only to the cluster's Service address, bounded (two requests, `max_tokens`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.cluster import OperatorProcess, eventually, namespace_scene, ready_pods, service_url, start_operator
from support.kubectl import exec_in, kubectl

NAME = "cached"
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
        "runtime": {"imagePullPolicy": "IfNotPresent", "compileCache": {"weights": True}},
        "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "replicas": 1}


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work: Path = tmp_path_factory.mktemp("weight-cache")
    with namespace_scene(kube) as (ns, stack):
        start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image))
        yield ns


def runtime_log(ns: str, pod: str, previous: bool = False) -> str:
    return subprocess.run([kubectl(), "logs", "-n", ns, pod, "-c", "runtime"] + (["--previous"] if previous else []),
                          check=True, timeout=60, capture_output=True, text=True).stdout


def restarts(kube: Any, ns: str, pod: str) -> int:
    status = kube.get(f"/api/v1/namespaces/{ns}/pods/{pod}")["status"]
    return next(c["restartCount"] for c in status.get("containerStatuses", []) if c["name"] == "runtime")


def test_a_restarted_runtime_container_loads_its_weights_from_the_cache(kube: Any, scene: str) -> None:
    ns = scene
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": NAME, "namespace": ns},
        "spec": SPEC})
    eventually(lambda: len(ready_pods(kube, ns, NAME)) == 1, 240, "a ready replica", 0.5)
    pod = ready_pods(kube, ns, NAME)[0]["metadata"]["name"]
    first_log = runtime_log(ns, pod)
    assert "weights written to the node's cache /var/cache/kubeinfer/weights/" in first_log, first_log[-3000:]
    listed = exec_in(ns, pod, "runtime", "ls -l /var/cache/kubeinfer/weights")
    assert ".weights" in listed, listed
    base = service_url(kube, ns, NAME)
    body = {"model": NAME, "prompt": "Kubernetes is", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    before = httpx.post(base + "/completions", json=body, timeout=60)
    assert before.status_code == 200, before.text

    exec_in(ns, pod, "runtime", "kill -TERM 1")   # the server drains and exits 0; the kubelet starts it again
    eventually(lambda: restarts(kube, ns, pod) == 1 and ready_pods(kube, ns, NAME), 240,
               "the runtime container started again and ready", 0.5)
    second_log = runtime_log(ns, pod)
    assert "weights from the node's cache /var/cache/kubeinfer/weights/" in second_log, second_log[-3000:]
    assert "loading weights:" not in second_log, "the restarted container read the checkpoint"
    print("first start:", [line for line in first_log.splitlines() if "ready in" in line],
          "\nrestarted, from the cache:", [line for line in second_log.splitlines() if "ready in" in line])
    after = httpx.post(base + "/completions", json=body, timeout=60)
    assert after.status_code == 200, after.text
    assert after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
