"""A mixture-of-experts model on the real node, expert-parallel on CPU, to the official openai client.

The runtime image bakes `demo-moe` (Qwen3-MoE layout, 8 experts, 2 active per token, random weights) beside the
demo. One InferenceService runs it with `parallelism.expert: 2` and no GPU: two runtime processes in the pod, each
with the whole attention and 4 of the 8 experts. What streams through the Service must be what one process on
this machine computes from the same model (built by the same code), and the pod's /metrics must count the routed
tokens of all 8 experts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from support import streams
from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, namespace_scene, pods_of, ready_pods, service_url,
    start_operator,
)

NAME = "moe"
PROMPT, MAX_TOKENS = "Experts split over processes", 24
EXPERTS, TOP_K, LAYERS = 8, 2, 4   # kubeinfer.runtime.demo.demo_moe_overrides, demo_config


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namespace_scene(kube) as (ns, stack):
        start_operator(stack, kube, OperatorProcess(
            ns, tmp_path_factory.mktemp("operator") / "operator.log", image=runtime_image))
        yield ns


def moe_spec() -> dict[str, Any]:
    return {"model": {"uri": "file:///opt/kubeinfer/models/demo-moe"},
            "runtime": {"imagePullPolicy": "IfNotPresent", "maxNumSeqs": 4, "maxModelLen": 1024},
            "parallelism": {"expert": 2},
            "resources": {"gpus": 0, "cpu": "1", "memory": "3Gi"}, "replicas": 1}


def routed_tokens(pod: dict[str, Any]) -> dict[str, float]:
    """kubeinfer_moe_expert_routed_tokens_total per expert label, from the pod's own /metrics."""
    text = httpx.get(f"http://{pod['status']['podIP']}:8000/metrics", timeout=5).text
    prefix = "kubeinfer_moe_expert_routed_tokens_total{"
    return {line.split('expert="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def test_expert_parallel_moe_streams_what_one_process_computes(
        kube: Any, scene: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, timings: dict[str, float]) -> None:
    applied = time.monotonic()
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{scene}/inferenceservices",
                 body={"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                       "metadata": {"name": NAME, "namespace": scene}, "spec": moe_spec()})
    [pod] = eventually(lambda: pods_of(kube, scene, NAME), 60, "the Deployment's pod", 0.1)
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "1"
    assert args[args.index("--expert-parallel-size") + 1] == "2"
    assert args[args.index("--cpu-threads") + 1] == "1"   # one CPU, shared by the two processes
    [pod] = eventually(lambda: ready_pods(kube, scene, NAME), 240, "the MoE pod to be Ready", 0.2)
    eventually(lambda: condition(kube.get(isvc_path(scene, NAME)), "Ready").get("status") == "True", 60,
               "Ready=True", 0.2)
    timings["apply -> MoE InferenceService Ready (EP=2 on CPU, real node)"] = time.monotonic() - applied

    api = streams.client(service_url(kube, scene, NAME))
    streamed = streams.stream_completion(api, NAME, PROMPT, MAX_TOKENS)
    assert streamed.whole(MAX_TOKENS), streamed.error

    from kubeinfer.runtime import demo
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(tmp_path / "models" / "demo"))   # demo-moe is built beside it
    with LLM("demo-moe", max_model_len=1024, num_kvcache_blocks=64) as llm:
        [local] = llm.generate([PROMPT], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    assert streamed.text == local.text   # EP=2 in the pod, one process here: the same greedy tokens

    routed = routed_tokens(pod)
    assert sorted(routed) == [str(e) for e in range(EXPERTS)]
    # Every token of every forward pass (the prompt, then each decode step), top-2 in each of the 4 layers.
    forwarded = len(local.prompt_token_ids) + MAX_TOKENS - 1
    assert sum(routed.values()) == forwarded * TOP_K * LAYERS
