"""Traces on the real cluster (docs/tracing.md): an InferenceService with `spec.observability.tracing` and a router,
deployed by the operator; the collector is an OTLP receiver in this test, on the node's own address (the pods reach
it as they reach the API server), so the spans come from the real pods' own processes with the resource attributes
the operator gave them. The local cluster only: the pods of another cluster cannot reach this machine.

Traffic goes only to the cluster's Service addresses, bounded (a few requests, `max_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.cluster import OperatorProcess, eventually, namespace_scene, ready_pods, service_url, start_operator
from support.otlp_receiver import OtlpReceiver
from support.router_view import router_pods, told

NAME = "traced"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "runtime": {"imagePullPolicy": "IfNotPresent"},
        "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "replicas": 1, "router": {}}


def node_address(kube: Any) -> str:
    [node] = kube.list("/api/v1/nodes")
    return next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, pod_to_pod: None, local_node: None, runtime_image: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, OtlpReceiver]]:
    work: Path = tmp_path_factory.mktemp("tracing")
    receiver = OtlpReceiver(host=node_address(kube))
    with namespace_scene(kube) as (ns, stack):
        stack.callback(receiver.stop)
        start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image))
        yield ns, receiver


def test_a_request_through_the_router_is_one_trace_from_the_pods_the_operator_configured(
        kube: Any, scene: tuple[str, OtlpReceiver], timings: dict[str, float]) -> None:
    ns, receiver = scene
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": NAME, "namespace": ns},
        "spec": {**SPEC, "observability": {"tracing": {"endpoint": receiver.url}}}})
    eventually(lambda: len(ready_pods(kube, ns, NAME)) == 1, 240, "a ready replica", 0.5)
    [replica] = ready_pods(kube, ns, NAME)
    eventually(lambda: [p for p in router_pods(kube, ns, NAME) if told(p)] or None, 120, "a router told its replica",
               0.3)
    base = service_url(kube, ns, f"{NAME}-router")
    sent = time.monotonic()
    response = httpx.post(base + "/completions", timeout=60,
                          headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
                          json={"model": NAME, "prompt": "Kubernetes is", "max_tokens": 8, "ignore_eos": True})
    assert response.status_code == 200, response.text

    def arrived() -> dict[str, Any] | None:   # the SDK's batch processor sends every 5 s
        spans = {s.name: s for s in receiver.spans_of(TRACE_ID)}
        return spans if {"POST /v1/completions", f"text_completion {NAME}", "decode"} <= spans.keys() else None
    spans = eventually(arrived, 60, "the request's spans from the router and the replica pods", 0.5)
    timings["tracing: request sent -> its spans received from the pods"] = time.monotonic() - sent
    route, request = spans["POST /v1/completions"], spans[f"text_completion {NAME}"]
    [call] = [s for s in receiver.spans_of(TRACE_ID) if s.name == f"POST http://{replica['status']['podIP']}:8000"]
    assert route.parent_span_id == "00f067aa0ba902b7" and call.parent_span_id == route.span_id
    assert request.parent_span_id == call.span_id
    assert request.resource["k8s.pod.name"] == replica["metadata"]["name"]
    assert request.resource["k8s.namespace.name"] == ns and request.resource["kubeinfer.inferenceservice"] == NAME
    assert route.resource["k8s.pod.name"] == router_pods(kube, ns, NAME)[0]["metadata"]["name"]
    assert request.attributes["gen_ai.usage.output_tokens"] == 8
