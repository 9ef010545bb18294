"""LoRA adapters' faults under steady load through the router (issue #56; docs/e2e.md, "Chaos suite"): on 2
replicas of the demo model, each a tensor-parallel pair of processes (rank 0 and a worker), serving 2 adapters
fetched from a stand-in Hub, with load clients asking for the base model and for each adapter.

- **An adapter's folder vanishes** on one replica (`rm -rf` in its fetcher sidecar's volume): the sidecar fetches it
  again in its next round (recovery: the folder complete again), while the replica serves the adapter from its host
  memory (the weights it checked at load), so it never reads the half-fetched folder. Nothing lost, no container
  restarted.
- **An adapter's weights file is truncated**, then the replica's engine restarts (kill -9): the new engine refuses
  that adapter at start with the reason (it used to stop the whole server: a corrupt safetensors file was not the
  adapter's error) and serves the base model and the other adapter; the router sends the broken adapter's requests
  to the replica that still holds it. Nothing lost.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kubeinfer.operator.reconcile.model_cache import DOWNLOAD_COMPLETE
from support.chaos_scene import (
    KILL_ENGINE, QUEUE_TIMEOUT_S, RECOVERY_LIMIT_S, ROUTER_REPLICAS, Scene, assert_nothing_lost, create_service,
    restarts, run_fault,
)
from support.cluster import OperatorProcess, eventually, namespace_scene, ready_pods, start_operator
from support.hub_pod import start_hub
from support.kubectl import exec_in

pytestmark = pytest.mark.chaos
NAME = "chaos-lora"
ADAPTERS = {"sql": "org/sql-lora", "chat": "org/chat-lora"}
VICTIM_ADAPTER = "sql"
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo", "credentialsSecret": "hub"},
        "replicas": 2, "parallelism": {"tensor": 2},
        "runtime": {"imagePullPolicy": "IfNotPresent", "maxModelLen": 1024,
                    "lora": {"maxLoras": 2, "maxLoraRank": 16}},
        "adapters": [{"name": name, "uri": f"hf://{repo}"} for name, repo in ADAPTERS.items()],
        "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"},
        "router": {"replicas": ROUTER_REPLICAS, "queueTimeoutSeconds": QUEUE_TIMEOUT_S}}


def adapters_report(pod: dict) -> dict[str, dict]:
    """The replica's own account of its adapters (GET /lora/adapters), by name."""
    answer = httpx.get(f"http://{pod['status']['podIP']}:8000/lora/adapters", timeout=10)
    return {a["name"]: a for a in answer.json()["adapters"]}


def all_loaded(scene: Scene) -> bool:
    pods = ready_pods(scene.kube, scene.ns, scene.name)
    return len(pods) == scene.replicas and all(
        all(adapters_report(p).get(name, {}).get("loaded") for name in ADAPTERS) for p in pods)


def adapter_folder() -> str:
    from kubeinfer.operator.reconcile.lora import fetch
    from kubeinfer.operator.spec import parse_spec
    spec = parse_spec(SPEC)
    [adapter] = [a for a in spec.adapters if a.name == VICTIM_ADAPTER]
    return fetch.adapter_dir(spec, adapter)


@pytest.fixture(scope="module")
def lora_scene(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    from kubeinfer.runtime import demo
    from support.lora import make_adapter
    root = tmp_path_factory.mktemp("chaos-lora")
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(root / "models" / "demo"))
    demo_dir = demo.resolve_model_dir("demo")
    folders = {repo: make_adapter(demo_dir, root / name, rank=8, seed=seed)
               for seed, (name, repo) in enumerate(ADAPTERS.items(), 11)}
    with namespace_scene(kube) as (ns, stack):
        stack.callback(monkeypatch.undo)
        start_hub(kube, ns, runtime_image, folders)
        operator = start_operator(stack, kube, OperatorProcess(ns, root / "operator.log", image=runtime_image))
        create_service(kube, ns, SPEC, NAME)
        scene = Scene(kube, ns, operator, name=NAME, models=[NAME, *ADAPTERS])
        eventually(lambda: scene.serving() and all_loaded(scene), RECOVERY_LIMIT_S,
                   "both replicas serving both adapters", 1)
        yield scene


def failures_only_of_the_victim(row: dict) -> None:
    others = [p for p in row["problems"] if f"({VICTIM_ADAPTER}," not in p]
    assert not others, others[:5]


def test_an_adapter_folder_vanishing_on_a_replica_loses_nothing(lora_scene: Scene) -> None:
    scene, folder = lora_scene, adapter_folder()
    victim = {}

    def inject() -> None:
        pod = ready_pods(scene.kube, scene.ns, scene.name)[0]
        victim["pod"] = pod["metadata"]["name"]
        victim["restarts"] = pod["status"]["containerStatuses"]
        exec_in(scene.ns, victim["pod"], "adapter-fetch", f"rm -rf {shlex.quote(folder)}")

    def fetched_again() -> bool:
        listing = exec_in(scene.ns, victim["pod"], "adapter-fetch", f"ls -a {shlex.quote(folder)} || true")
        return DOWNLOAD_COMPLETE in listing.split() and scene.serving() and all_loaded(scene)

    row = run_fault(scene, "LoRA adapter folder vanished", f"rm -rf of adapter {VICTIM_ADAPTER}'s folder in one of "
                    "2 TP=2 replica pods (the fetcher sidecar fetches it again)", inject, recovered=fetched_again)
    assert_nothing_lost(row)
    failures_only_of_the_victim(row)
    pod = scene.kube.get(f"/api/v1/namespaces/{scene.ns}/pods/{victim['pod']}")
    runtime = {c["name"]: c["restartCount"] for c in pod["status"]["containerStatuses"]}
    assert runtime == {c["name"]: c["restartCount"] for c in victim["restarts"]}, "a container restarted"


def test_a_truncated_adapter_file_and_an_engine_restart_lose_nothing(lora_scene: Scene) -> None:
    scene, folder = lora_scene, adapter_folder()
    weights = shlex.quote(f"{folder}/adapter_model.safetensors")
    victim = {}

    def restarted() -> bool:   # the runtime is the pod's one container (the fetcher is an init sidecar)
        return restarts(scene, victim["pod"]) > victim["restarts"]

    def inject() -> None:
        victim["pod"] = ready_pods(scene.kube, scene.ns, scene.name)[0]["metadata"]["name"]
        victim["restarts"] = restarts(scene, victim["pod"])
        exec_in(scene.ns, victim["pod"], "adapter-fetch",
                f"head -c 200 {weights} > /tmp/cut && cat /tmp/cut > {weights}")
        exec_in(scene.ns, victim["pod"], "runtime", KILL_ENGINE)
        eventually(restarted, 120, "the runtime container restarted", 0.2)

    row = run_fault(scene, "LoRA adapter file truncated, engine restarted",
                    f"adapter {VICTIM_ADAPTER}'s weights cut to 200 bytes in one of 2 TP=2 replica pods, then kill -9 "
                    "of its engine's ranks (the container restarts with the broken file)", inject)
    assert_nothing_lost(row)
    failures_only_of_the_victim(row)
    [pod] = [p for p in ready_pods(scene.kube, scene.ns, scene.name) if p["metadata"]["name"] == victim["pod"]]
    # The restarted replica names what is wrong (its adapters-list pass retries the load and reports the refusal).
    report = eventually(lambda: (r := adapters_report(pod)) and VICTIM_ADAPTER in r and r, 30,
                        "the restarted replica's report of the broken adapter", 0.5)
    assert report["chat"]["loaded"], report
    assert not report[VICTIM_ADAPTER]["loaded"] and "truncated or corrupt" in report[VICTIM_ADAPTER]["message"], report
    assert restarted()
