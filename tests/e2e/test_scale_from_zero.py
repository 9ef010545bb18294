"""Scale from zero through the router, for real: an InferenceService at 0 replicas, `kubeinfer router`
following its Service's EndpointSlices, and `kubeinfer operator` reading the router's waiting requests
(`autoscaling.routerMetricsUrl`). One request at the router starts the first replica and is served by it;
after the idle period the service returns to zero.

Router and operator run on this machine with the kubeconfig, as the local cluster's README says (its pods
cannot reach the API server); on a cluster where they can, the same two commands run in pods.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import free_port, stop_process, streams
from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, namespace_scene,
    pods_of, ready_pods, start_operator,
)

NAME = "zero"
IDLE_S = 10
AUTOSCALING = {"minReplicas": 0, "maxReplicas": 1, "metricWindowSeconds": 5, "scaleToZeroIdleSeconds": IDLE_S,
               "scaleDownStabilizationSeconds": 0, "initialDelaySeconds": 0}


@pytest.fixture(scope="module")
def setup(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    work: Path = tmp_path_factory.mktemp("zero")
    with namespace_scene(kube) as (ns, stack):
        port = free_port()
        router_log = stack.enter_context((work / "router.log").open("w"))
        router = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "router", "--service", NAME,
                                   "--namespace", ns, "--host", "127.0.0.1", "--port", str(port),
                                   "--served-model-name", NAME, "--queue-timeout", "180"],
                                  stdout=router_log, stderr=subprocess.STDOUT, cwd="/")
        stack.callback(stop_process, router, 30)
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image,
                                                               env={"KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "1"}))
        url = f"http://127.0.0.1:{port}"
        eventually(lambda: httpx.get(url + "/v1/models", timeout=1).status_code == 200, 30, "the router up", 0.2)
        yield ns, url, operator, work


def test_a_request_at_the_router_starts_the_first_replica_and_idle_returns_to_zero(
        kube: Any, setup: tuple, timings: dict[str, float]) -> None:
    ns, url, operator, work = setup
    spec = {"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "replicas": 0,
            "runtime": {"imagePullPolicy": "IfNotPresent"},
            "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"},
            "autoscaling": {**AUTOSCALING, "routerMetricsUrl": url + "/metrics"}}
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": NAME, "namespace": ns},
        "spec": spec})
    time.sleep(3)   # a few autoscaler passes with nobody waiting: zero stays zero
    assert kube.get(isvc_path(ns, NAME))["spec"]["replicas"] == 0 and not pods_of(kube, ns, NAME)
    models = httpx.get(url + "/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [NAME]   # listed while it has no replica

    sent = time.monotonic()
    result = streams.stream_completion(streams.client(url + "/v1", timeout_s=180), NAME, "Kubernetes is", 16)
    served = time.monotonic()
    assert result.whole(16), (result, (work / "router.log").read_text()[-2000:])
    obj = kube.get(isvc_path(ns, NAME))
    [event] = [e for e in obj["status"]["scalingHistory"]["events"] if e["from"] == 0 and e["to"] == 1]
    assert event["reason"] == "ScaleFromZero", event
    timings["scale from zero: request at the router -> first token (pod created, loaded, Ready)"] = (
        result.first_token_s or 0.0)
    timings["scale from zero: request at the router -> whole answer (16 tokens)"] = served - sent

    # Idle: back to zero after scaleToZeroIdleSeconds (and the pod goes).
    idle_from = time.monotonic()
    eventually(lambda: kube.get(isvc_path(ns, NAME))["spec"]["replicas"] == 0, 90, "spec.replicas back to 0", 0.5)
    to_zero = time.monotonic()
    eventually(lambda: not pods_of(kube, ns, NAME), 120, "the pod gone", 0.5)
    timings[f"scale to zero: last answer -> spec.replicas 0 (scaleToZeroIdleSeconds {IDLE_S})"] = to_zero - idle_from
    assert condition(kube.get(isvc_path(ns, NAME)), "Ready").get("status") in ("True", "False")
    assert not ready_pods(kube, ns, NAME)
    assert "Traceback" not in operator.output()
