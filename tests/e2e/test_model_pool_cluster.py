"""A model pool on the real cluster (docs/router.md, "Model pool"; issue #51): an InferenceService with
`spec.modelPool` deployed by the operator serves two models (the demo Llama and the demo MoE) from one pod, at most
one awake. Requests that alternate between them through the router's Service are all answered, each by its own
model, and the InferenceService's status shows the swaps (which model is awake, the engines' wake-ups).

Traffic goes only to the cluster's Service addresses, bounded (a few requests, `max_tokens`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.cluster import (
    OperatorProcess, eventually, isvc_path, namespace_scene, ready_pods, service_url, start_operator,
)

NAME = "pool"
OTHER = "moe"
ROUNDS = 3
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
        "modelPool": {"models": [{"servedName": OTHER, "uri": "file:///opt/kubeinfer/models/demo-moe"}]},
        "router": {}, "runtime": {"imagePullPolicy": "IfNotPresent", "kvCacheMemoryGib": 0.25},
        "resources": {"gpus": 0, "cpu": "500m", "memory": "3Gi"}, "replicas": 1}
SYNC_SECONDS = 1   # the operator's periodic pass, which refreshes status.modelPool


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work: Path = tmp_path_factory.mktemp("model-pool")
    with namespace_scene(kube) as (ns, stack):
        start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image,
                                                    env={"KUBEINFER_ADAPTER_SYNC_SECONDS": str(SYNC_SECONDS)}))
        yield ns


def pool_status(kube: Any, ns: str) -> dict[str, Any]:
    return (kube.get(isvc_path(ns, NAME)).get("status") or {}).get("modelPool") or {}


def serves_both(base: str) -> bool:
    try:
        listed = httpx.get(base + "/models", timeout=10).json()["data"]
        return [m["id"] for m in listed] == [NAME, OTHER]
    except (httpx.HTTPError, KeyError, ValueError):
        return False


def test_two_models_in_one_pod_requests_alternating_and_the_status_shows_the_swaps(kube: Any, scene: str) -> None:
    ns = scene
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": NAME, "namespace": ns},
        "spec": SPEC})
    eventually(lambda: len(ready_pods(kube, ns, NAME)) == 1, 300, "a ready replica", 0.5)
    # the launcher starts the first model asleep, then the last one awake
    start = eventually(lambda: (s := pool_status(kube, ns)).get("replicas") and s["replicas"][0]["awake"] == [OTHER]
                       and s, 120, "status.modelPool: the last model awake", 0.5)
    assert start["maxAwake"] == 1 and start["replicas"][0]["asleep"] == [NAME], start
    woke_before = start["replicas"][0]["wakeups"]
    base = service_url(kube, ns, f"{NAME}-router")
    eventually(lambda: serves_both(base), 120, "the router serving both models", 0.5)

    seconds: dict[str, list[float]] = {NAME: [], OTHER: []}
    texts: dict[str, set[str]] = {NAME: set(), OTHER: set()}
    for _ in range(ROUNDS):
        for model in (NAME, OTHER):
            body = {"model": model, "prompt": "Kubernetes is", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            started = time.monotonic()
            answer = httpx.post(base + "/completions", json=body, timeout=120)
            seconds[model].append(time.monotonic() - started)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model and answer.json()["usage"]["completion_tokens"] == 8
            texts[model].add(answer.json()["choices"][0]["text"])
    assert len(texts[NAME]) == len(texts[OTHER]) == 1   # greedy: each model answers the same every time
    assert texts[NAME] != texts[OTHER]                  # two models: each request reached its own

    # every request found its model asleep: one wake-up each, and the last one (OTHER) awake
    done = eventually(lambda: (s := pool_status(kube, ns))["replicas"][0]["wakeups"] >= woke_before + 2 * ROUNDS
                      and s, 60, "status.modelPool counting the wake-ups", 0.5)
    replica = done["replicas"][0]
    assert (replica["awake"], replica["asleep"]) == ([OTHER], [NAME]), done
    print(f"\nmodel pool on the cluster: {2 * ROUNDS} requests alternating, each after a swap: median "
          f"{statistics.median(seconds[NAME] + seconds[OTHER]):.2f} s (8 tokens); status {done}")
