"""LoRA adapters on the real node (docs/lora.md): an adapter added to a running InferenceService serves through its
Service with no pod restarted and no rollout, with what one process here computes from the same adapter; removed,
its name is 404 again.

The base model is the demo baked in the runtime image (`file://`). The adapter is made here with peft for that
same demo model (built by the same code), and served by a stand-in Hugging Face Hub in a pod of the cluster
(tests/support/hub_standin.py, its files from a ConfigMap); `HF_ENDPOINT` reaches the pods' adapter-fetch sidecar
through `model.credentialsSecret`. The replica loads it itself once the sidecar has fetched it (it follows the
sidecar's list, `--lora-modules-file`); the operator only reads what it serves, with no key and no Secret.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from support import streams
from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, namespace_scene, ready_pods, service_url, start_operator,
)
from support.hub_pod import start_hub

NAME, ADAPTER, REPO = "tuned", "sql", "org/sql-lora"
PROMPT, MAX_TOKENS = "SELECT name FROM", 12
# What may pass between the spec change and the adapter serving: the kubelet's refresh of the mounted ConfigMap
# (its sync period, 60 s, plus its cache TTL), the sidecar's 5 s round, the operator's 15 s adapter pass.
ADAPTER_DEADLINE_S = 60 + 60 + 5 + 15 + 30


def demo_and_adapter(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The demo model as the image bakes it, and a rank-8 PEFT adapter of it (every projection)."""
    from kubeinfer.runtime import demo
    from support.lora import make_adapter
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(root / "models" / "demo"))
    demo_dir = demo.resolve_model_dir("demo")
    return demo_dir, make_adapter(demo_dir, root / "adapter", rank=8, seed=7)


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    monkeypatch = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("lora")
    demo_dir, adapter = demo_and_adapter(root, monkeypatch)
    with namespace_scene(kube) as (ns, stack):
        stack.callback(monkeypatch.undo)
        url = start_hub(kube, ns, runtime_image, {REPO: adapter})
        start_operator(stack, kube, OperatorProcess(ns, root / "operator.log", image=runtime_image))
        yield ns, demo_dir, adapter, url


def spec(adapters: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": {"uri": "file:///opt/kubeinfer/models/demo", "credentialsSecret": "hub"},
            "runtime": {"imagePullPolicy": "IfNotPresent", "maxNumSeqs": 4, "maxModelLen": 1024,
                        "lora": {"maxLoras": 2, "maxLoraRank": 16}},
            "adapters": adapters, "resources": {"gpus": 0, "cpu": "500m", "memory": "2Gi"}, "replicas": 1}


def complete(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/completions", timeout=60, json={
        "model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})


def test_an_adapter_added_to_a_running_service_serves_without_a_restart_and_removed_is_404(
        kube: Any, scene: tuple, timings: dict[str, float]) -> None:
    ns, demo_dir, adapter, hub_url = scene
    body = {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": ns}, "spec": spec([])}
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body=body)
    [pod] = eventually(lambda: ready_pods(kube, ns, NAME), 240, "the replica Ready", 0.2)
    uid = pod["metadata"]["uid"]
    restarts = {c["name"]: c["restartCount"] for c in pod["status"]["containerStatuses"]}
    url = service_url(kube, ns, NAME)
    assert complete(url, ADAPTER).status_code == 404

    added = time.monotonic()
    kube.request("PATCH", isvc_path(ns, NAME), body={"spec": {"adapters": [{"name": ADAPTER, "uri": f"hf://{REPO}"}]}},
                 content_type="application/merge-patch+json")
    answer = eventually(lambda: (r := complete(url, ADAPTER)).status_code == 200 and r, ADAPTER_DEADLINE_S,
                        "the adapter to serve through the Service", 1.0)
    timings["LoRA: adapter added to the spec -> serving through the Service (real node)"] = time.monotonic() - added

    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    with LLM(str(demo_dir), max_model_len=1024, num_kvcache_blocks=64, max_loras=1) as llm:
        llm.load_lora(ADAPTER, str(adapter))
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        [local] = llm.generate([PROMPT], dataclasses.replace(params, lora_name=ADAPTER))
        [base] = llm.generate([PROMPT], params)
    assert answer.json()["choices"][0]["text"] == local.text
    assert complete(url, NAME).json()["choices"][0]["text"] == base.text != local.text

    [now] = ready_pods(kube, ns, NAME)
    assert now["metadata"]["uid"] == uid   # the same pod: no rollout
    assert {c["name"]: c["restartCount"] for c in now["status"]["containerStatuses"]} == restarts
    # The replica loads the adapter itself; the operator's next pass (every KUBEINFER_ADAPTER_SYNC_SECONDS, 15 s)
    # reads it into the status.
    def loaded_status() -> dict[str, Any] | None:
        status = kube.get(isvc_path(ns, NAME))["status"]
        ready = [(a["name"], a["readyReplicas"]) for a in status.get("adapters") or []]
        return status if ready == [(ADAPTER, 1)] else None
    status = eventually(loaded_status, 60, "status.adapters to say the adapter is loaded on the replica", 0.5)
    assert condition(kube.get(isvc_path(ns, NAME)), "AdaptersReady").get("status") == "True", status
    models = streams.client(url).models.list().data
    assert {m.id for m in models} == {NAME, ADAPTER}

    removed = time.monotonic()
    kube.request("PATCH", isvc_path(ns, NAME), body={"spec": {"adapters": []}},
                 content_type="application/merge-patch+json")
    eventually(lambda: complete(url, ADAPTER).status_code == 404, ADAPTER_DEADLINE_S, "404 for the removed adapter", 1.0)
    timings["LoRA: adapter removed from the spec -> 404 (real node)"] = time.monotonic() - removed
    with pytest.raises(openai.NotFoundError):
        streams.client(url).completions.create(model=ADAPTER, prompt=PROMPT, max_tokens=2)
    [still] = ready_pods(kube, ns, NAME)
    assert still["metadata"]["uid"] == uid
