"""Disaggregated serving's faults under steady load through the router (issue #56; docs/e2e.md, "Chaos suite"): one
prefill and one decode replica of the demo model, the router signing its KV-source hints (`kvSourceKeySecretRef`),
prompts of about 600 tokens so that each request's KV crosses between the pods.

- **The prefill replica's engine killed mid-transfer** (kill -9; its container restarts): the decode replica's pull
  breaks, it answers `kv_transfer_failed` before any token, and the router serves the request colocated.
- **The KV source stalls** (the prefill engine SIGSTOPped for longer than the decode side's idle timeout, then
  SIGCONTed): the pulls time out and those requests are served colocated.
- **A KV source that sends garbage** (a pod answering every connection with random bytes), named to the decode
  replica directly with a valid signature (as a compromised or broken source would be): each such request gets a
  clean error and the decode replica goes on serving the load.

Each: nothing lost; the fallbacks are the routers' `kubeinfer_router_disaggregation_requests_total{path="fallback"}`.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.chaos_scene import (
    ENGINE_PIDS, KILL_ENGINE, QUEUE_TIMEOUT_S, RECOVERY_LIMIT_S, ROUTER_REPLICAS, Scene, assert_nothing_lost,
    create_service, restarts, run_fault,
)
from support.cluster import OperatorProcess, eventually, is_ready, namespace_scene, pods_of, start_operator
from support.kubectl import exec_in
from support.router_view import metrics, router_pods, told, total

pytestmark = pytest.mark.chaos
NAME = "chaos-split"
POOL_LABEL = "kubeinfer.dev/pool"
PREFILL_ANNOTATION = "kubeinfer.dev/router-prefill-endpoints"
KV_PORT = 9100
KV_IDLE_TIMEOUT_S = 30     # the runtime's default (--kv-idle-timeout)
STALL_S = KV_IDLE_TIMEOUT_S + 10
PROMPT_REPEAT = 30         # ~600 tokens of the demo model's tokenizer
GARBAGE_REQUESTS = 5
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
        "runtime": {"imagePullPolicy": "IfNotPresent", "maxModelLen": 2048},
        "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"},
        "router": {"replicas": ROUTER_REPLICAS, "queueTimeoutSeconds": QUEUE_TIMEOUT_S},
        "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                           "kvSourceKeySecretRef": {"name": "kv-key"}}}
GARBAGE_SOURCE = f"""
import os, socket
server = socket.create_server(("0.0.0.0", {KV_PORT}), reuse_port=True)
while True:
    peer, _ = server.accept()
    try:
        peer.sendall(os.urandom(1 << 16))
    except OSError:
        pass
    peer.close()
"""


@dataclasses.dataclass
class SplitScene(Scene):
    key: bytes = b""

    def pool(self, role: str) -> list[dict]:
        return [p for p in pods_of(self.kube, self.ns, self.name) if not p["metadata"].get("deletionTimestamp")
                and (p["metadata"].get("labels") or {}).get(POOL_LABEL) == role]

    def urls(self, role: str) -> list[str]:
        return sorted(f"http://{p['status']['podIP']}:8000" for p in self.pool(role) if is_ready(p))

    def serving(self) -> bool:
        """One Ready replica in each pool, every router pod Ready and told both, a request through it answered."""
        decode, prefill = self.urls("decode"), self.urls("prefill")
        if len(decode) != 1 or len(prefill) != 1 or len(self.pool("decode")) + len(self.pool("prefill")) != 2:
            return False
        routers = router_pods(self.kube, self.ns, self.name)
        if len(routers) != ROUTER_REPLICAS or not all(
                is_ready(p) and told(p) == decode
                and sorted(json.loads((p["metadata"].get("annotations") or {}).get(PREFILL_ANNOTATION, "[]")))
                == prefill for p in routers):
            return False
        answer = httpx.post(self.router_url + "/completions", timeout=QUEUE_TIMEOUT_S + 30, json={
            "model": self.name, "prompt": "probe", "max_tokens": 2, "ignore_eos": True})
        return answer.status_code == 200

    def paths(self) -> dict[str, float]:
        """The routers' requests by path (disaggregated, fallback, colocated), summed over the router pods."""
        pages = [metrics(f"http://{p['status']['podIP']}:8080") for p in router_pods(self.kube, self.ns, self.name)]
        return {path: sum(total(page, "kubeinfer_router_disaggregation_requests_total", path=path) for page in pages)
                for path in ("disaggregated", "fallback", "colocated")}


@pytest.fixture(scope="module")
def split_scene(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[SplitScene]:
    work: Path = tmp_path_factory.mktemp("chaos-split")
    key = secrets.token_hex(32)
    with namespace_scene(kube) as (ns, stack):
        kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kv-key"},
            "stringData": {"kv-source-key": key}})
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image))
        create_service(kube, ns, SPEC, NAME)
        scene = SplitScene(kube, ns, operator, name=NAME, replicas=2, prompt_repeat=PROMPT_REPEAT,
                           key=key.encode())
        eventually(scene.serving, RECOVERY_LIMIT_S, "the split service serving", 1)
        yield scene


def run_in(scene: SplitScene, pod: str, command: str) -> None:
    exec_in(scene.ns, pod, "runtime", command)


def prefill_pod(scene: SplitScene) -> str:
    [pod] = [p for p in scene.pool("prefill") if is_ready(p)]
    return pod["metadata"]["name"]


def test_the_prefill_engine_killed_mid_transfer_loses_nothing(split_scene: SplitScene) -> None:
    scene = split_scene
    before = {}

    def inject() -> None:
        before["paths"] = scene.paths()
        pod = prefill_pod(scene)
        count = restarts(scene, pod)
        run_in(scene, pod, KILL_ENGINE)
        eventually(lambda: restarts(scene, pod) > count, 120, "the prefill container restarted", 0.2)

    row = run_fault(scene, "prefill engine killed", "kill -9 of the prefill replica's engine under load "
                    "(~600-token prompts; its container restarts)", inject)
    row["fallback"] = scene.paths()["fallback"] - before["paths"]["fallback"]
    print(f"\nchaos: served colocated after a failed transfer: {row['fallback']}")
    assert_nothing_lost(row)
    assert row["failed"] == 0, row["problems"][:5]


def test_a_stalled_kv_source_loses_nothing(split_scene: SplitScene) -> None:
    scene = split_scene
    before = {}

    def inject() -> None:
        pod = prefill_pod(scene)
        before["paths"] = scene.paths()
        run_in(scene, pod, f"kill -STOP $({ENGINE_PIDS})")
        try:
            time.sleep(STALL_S)
        finally:
            run_in(scene, pod, f"kill -CONT $({ENGINE_PIDS})")

    row = run_fault(scene, "KV source stalled", f"the prefill replica's engine SIGSTOPped {STALL_S} s (the decode "
                    f"side's idle timeout is {KV_IDLE_TIMEOUT_S} s), then SIGCONTed", inject)
    row["fallback"] = scene.paths()["fallback"] - before["paths"]["fallback"]
    print(f"\nchaos: served colocated after a failed transfer: {row['fallback']}")
    assert_nothing_lost(row)
    assert row["failed"] == 0, row["problems"][:5]
    assert row["fallback"] > 0, "no transfer timed out: the stall did not reach a request"


def test_a_kv_source_sending_garbage_gets_a_clean_error_and_loses_nothing(split_scene: SplitScene,
                                                                           runtime_image: str) -> None:
    from kubeinfer.runtime.disagg.source_signature import FIELD, sign
    scene = split_scene
    base = f"/api/v1/namespaces/{scene.ns}"
    scene.kube.request("POST", f"{base}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "garbage"},
        "spec": {"containers": [{
            "name": "garbage", "image": runtime_image, "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-c", GARBAGE_SOURCE],
            "readinessProbe": {"tcpSocket": {"port": KV_PORT}, "periodSeconds": 1}}]}})
    garbage = eventually(lambda: (p := scene.kube.get(f"{base}/pods/garbage")) and is_ready(p) and p, 120,
                         "the garbage source pod Ready", 0.5)
    source = f"{garbage['status']['podIP']}:{KV_PORT}"
    answers = []

    def inject() -> None:
        [decode_url] = scene.urls("decode")
        for n in range(GARBAGE_REQUESTS):
            answer = httpx.post(decode_url + "/v1/completions", timeout=QUEUE_TIMEOUT_S + KV_IDLE_TIMEOUT_S, json={
                "model": scene.name, "prompt": f"garbage {n}", "max_tokens": 8, "kubeinfer_kv_source": source,
                FIELD: sign(scene.key, source)})
            answers.append((answer.status_code, answer.json()))

    row = run_fault(scene, "KV source sends garbage", f"{GARBAGE_REQUESTS} signed requests to the decode replica "
                    "naming a pod that answers with random bytes", inject)
    assert_nothing_lost(row)
    assert row["failed"] == 0, row["problems"][:5]
    for status, body in answers:
        assert status == 502 and body["error"]["code"] == "kv_transfer_failed", (status, body)
    row["garbage_answers"] = [f"{status} {body['error']['message'][:120]}" for status, body in answers]
    print(f"\nchaos: the garbage source's requests: {row['garbage_answers']}")
