"""What a person sees when pods cannot run, on a real node: each failure becomes Degraded=True (and Ready=False)
with its own reason and a message naming the cause.

- more GPUs than any node has → InsufficientGPU (the scheduler's "Insufficient nvidia.com/gpu");
- a model path that is not there → CrashLoop (the runtime exits 2 with one line; the kubelet backs off);
- an image that cannot be pulled → ImagePullFailed.
The three run side by side under one `kubeinfer operator`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, namespace_scene, start_operator,
)

CPU = {"gpus": 0, "cpu": "100m", "memory": "1Gi"}
CASES = {
    # name: (spec, Degraded reason, words in the message)
    "too-many-gpus": ({"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "parallelism": {"tensor": 64}},
                      "InsufficientGPU", ["cannot be scheduled", "Insufficient nvidia.com/gpu"]),
    "bad-model-path": ({"model": {"uri": "file:///models/not-there"}, "resources": CPU},
                       "CrashLoop", ["keeps crashing", "code 2",
                                     "kubeinfer: error: model folder '/models/not-there' does not exist"]),
    "bad-image": ({"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "resources": CPU,
                   "runtime": {"image": "localhost/kubeinfer/no-such-image:0", "imagePullPolicy": "IfNotPresent"}},
                  "ImagePullFailed", ["cannot pull image localhost/kubeinfer/no-such-image:0"]),
}
@pytest.fixture(scope="module")
def ns(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namespace_scene(kube) as (namespace, stack):
        start_operator(stack, kube, OperatorProcess(namespace, tmp_path_factory.mktemp("operator") / "operator.log",
                                                    image=runtime_image))
        for name, (spec, _, _) in CASES.items():
            kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{namespace}/inferenceservices",
                         body={"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                               "metadata": {"name": name, "namespace": namespace}, "spec": {"replicas": 1, **spec}})
        yield namespace


def stamp(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("name", list(CASES))
def test_a_pod_that_cannot_run_is_explained(kube: Any, ns: str, name: str, timings: dict[str, float]) -> None:
    _, reason, words = CASES[name]
    obj = eventually(lambda: (o := kube.get(isvc_path(ns, name))) and condition(o, "Degraded").get("reason") == reason
                     and o, 240, f"Degraded reason {reason}", 0.5)
    degraded, ready = condition(obj, "Degraded"), condition(obj, "Ready")
    # From the API server's own clock (whole seconds): the tests wait for the cases one after the other.
    timings[f"created -> Degraded={reason} ({name}), API timestamps"] = \
        stamp(degraded["lastTransitionTime"]) - stamp(obj["metadata"]["creationTimestamp"])
    assert degraded["status"] == "True"
    for word in words:
        assert word in degraded["message"], degraded["message"]
    assert ready["status"] == "False" and ready["reason"] == reason
    assert obj["status"]["readyReplicas"] == 0
