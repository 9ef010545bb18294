"""kubectl apply → streamed tokens, on a real node with the real runtime image and the CPU demo model.

One InferenceService lives through the scenarios of this module, in order: apply → Ready with an endpoint
and a first token through the Service; completion and stream with the official `openai` client; scaled to
two pods that both serve; a spec change rolled out under 20 streams with none cut; a deleted pod replaced;
a deleted or hand-edited Deployment restored; an operator restart that duplicates nothing and writes
nothing; deletion garbage-collects everything. `kubeinfer operator` runs as a separate process on this
machine, out of the box (no flags but the namespace).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from support import streams
from support.cluster import (
    OperatorProcess, condition, eventually, is_ready, isvc_path, pod_counter, pods_of, ready_pods, namespace_scene,
    service_url, start_operator,
)

NAME = "demo"
MERGE = "application/merge-patch+json"
ROLLOUT_STREAMS, ROLLOUT_TOKENS = 20, 1000
PRESTOP_SECONDS = 5   # kubeinfer.operator.reconcile.pod.PRESTOP_SLEEP_SECONDS


@dataclass
class Scene:
    ns: str
    operator: OperatorProcess

    def path(self, kind: str) -> str:
        group = {"deployments": "/apis/apps/v1", "poddisruptionbudgets": "/apis/policy/v1"}.get(kind, "/api/v1")
        return f"{group}/namespaces/{self.ns}/{kind}/{NAME}"


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with namespace_scene(kube) as (ns, stack):
        operator = start_operator(stack, kube, OperatorProcess(
            ns, tmp_path_factory.mktemp("operator") / "operator.log", image=runtime_image))
        yield Scene(ns, operator)


def demo_spec() -> dict[str, Any]:
    return {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
            "runtime": {"imagePullPolicy": "IfNotPresent", "maxNumSeqs": 4, "maxModelLen": 2048,
                        "drainTimeoutSeconds": 120},
            "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "replicas": 1}


def api(kube: Any, scene: Scene) -> Any:
    return streams.client(service_url(kube, scene.ns, NAME))


def first_token_through_service(kube: Any, scene: Scene, deadline_s: float) -> float:
    """Monotonic time of the first streamed token through the Service (retried while endpoints catch up)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        sent = time.monotonic()
        result = streams.stream_completion(streams.client(service_url(kube, scene.ns, NAME), timeout_s=10), NAME,
                                           "Kubernetes is", 8)
        if result.whole(8):
            return sent + (result.first_token_s or 0.0)
        time.sleep(0.1)
    raise AssertionError("no token through the Service")


def test_apply_becomes_ready_with_an_endpoint_and_streams_a_first_token(
        kube: Any, scene: Scene, timings: dict[str, float]) -> None:
    applied = time.monotonic()
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{scene.ns}/inferenceservices",
                 body={"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                       "metadata": {"name": NAME, "namespace": scene.ns}, "spec": demo_spec()})
    [pod] = eventually(lambda: pods_of(kube, scene.ns, NAME), 60, "the Deployment's pod", 0.1)
    pod_seen = time.monotonic()
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(container["resources"]) and "--device" in container["args"]
    eventually(lambda: ready_pods(kube, scene.ns, NAME), 180, "the pod to be Ready", 0.1)
    pod_ready = time.monotonic()
    obj = eventually(lambda: (o := kube.get(isvc_path(scene.ns, NAME))) and condition(o, "Ready").get("status")
                     == "True" and o, 60, "Ready=True", 0.1)
    isvc_ready = time.monotonic()
    assert obj["status"]["endpoint"] == f"http://{NAME}.{scene.ns}.svc/v1"
    assert obj["status"]["readyReplicas"] == 1 and condition(obj, "Degraded")["status"] == "False"
    first_token = first_token_through_service(kube, scene, 60)
    timings["apply -> pod created"] = pod_seen - applied
    timings["pod created -> pod Ready (CPU demo model, real node)"] = pod_ready - pod_seen
    timings["apply -> InferenceService Ready=True"] = isvc_ready - applied
    timings["apply -> first token through the Service"] = first_token - applied


def test_openai_client_gets_a_completion_and_a_stream_through_the_service(kube: Any, scene: Scene) -> None:
    client = api(kube, scene)
    whole = client.completions.create(model=NAME, prompt="A pod is", max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.usage.completion_tokens == 24 and whole.choices[0].finish_reason == "length"
    streamed = streams.stream_completion(client, NAME, "A pod is", 24)
    assert streamed.whole(24) and streamed.text == whole.choices[0].text
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert chat.choices[0].message.role == "assistant"


def test_scaled_to_two_both_pods_serve(kube: Any, scene: Scene, timings: dict[str, float]) -> None:
    started = time.monotonic()
    # What `kubectl scale infsvc/demo --replicas 2` sends: a patch of the scale subresource.
    kube.request("PATCH", isvc_path(scene.ns, NAME) + "/scale", body={"spec": {"replicas": 2}}, content_type=MERGE)
    pods = eventually(lambda: len(r := ready_pods(kube, scene.ns, NAME)) == 2 and r, 180, "two Ready pods", 0.2)
    timings["kubectl scale 1 -> 2: second pod Ready"] = time.monotonic() - started
    eventually(lambda: kube.get(isvc_path(scene.ns, NAME))["status"]["readyReplicas"] == 2, 30, "readyReplicas 2")
    before = {p["metadata"]["name"]: pod_counter(p) for p in pods}
    url = service_url(kube, scene.ns, NAME)
    for _ in range(60):   # bounded. The Service spreads connections, not requests: one client per request.
        with streams.client(url) as client:
            client.completions.create(model=NAME, prompt="spread", max_tokens=2)
        if all(pod_counter(p) > before[p["metadata"]["name"]] for p in pods):
            break
    served = {p["metadata"]["name"]: pod_counter(p) - before[p["metadata"]["name"]] for p in pods}
    assert all(count > 0 for count in served.values()), served


def held(pod: dict[str, Any]) -> float:
    """Requests a pod holds (running + waiting), from its own gauges."""
    return pod_counter(pod, "kubeinfer_num_requests_running") + pod_counter(pod, "kubeinfer_num_requests_waiting")


def in_flight_after_sigterm(kube: Any, scene: Scene, old: set[str], timeout_s: float) -> float:
    """Requests the first old pod to be terminated still held once its preStop sleep was over (so after
    its SIGTERM), read from its own gauges while it drains."""
    victim = eventually(lambda: next((p for p in pods_of(kube, scene.ns, NAME) if p["metadata"]["name"] in old
                                      and p["metadata"].get("deletionTimestamp")), None),
                        timeout_s, "an old pod to be terminated", 0.1)
    seen, most = time.monotonic(), 0.0
    while time.monotonic() - seen < timeout_s:
        try:
            now_held = held(victim)
        except Exception:  # noqa: BLE001  (the pod is gone: drained and exited)
            break
        if time.monotonic() - seen > PRESTOP_SECONDS + 0.5:
            most = max(most, now_held)
        time.sleep(0.2)
    return most


def test_spec_change_rolls_out_under_20_streams_with_none_cut(kube: Any, scene: Scene,
                                                             timings: dict[str, float]) -> None:
    pods = pods_of(kube, scene.ns, NAME)
    old = {p["metadata"]["name"] for p in pods}
    pool = streams.StreamPool(api(kube, scene), NAME, ROLLOUT_STREAMS, ROLLOUT_TOKENS, prompt="rollout")
    # Admitted, not all running: each pod runs 4 at a time (maxNumSeqs) and queues the rest.
    eventually(lambda: sum(held(p) for p in pods) == ROLLOUT_STREAMS, 60, "all 20 streams admitted", 0.1)
    started = time.monotonic()
    # The new pods also speculate (prompt lookup): the next test checks what they serve.
    kube.request("PATCH", isvc_path(scene.ns, NAME), body={"spec": {"runtime": {
        "maxNumSeqs": 6, "speculative": {"method": "ngram", "ngramMin": 1}}}}, content_type=MERGE)
    draining = in_flight_after_sigterm(kube, scene, old, 180)
    results = pool.join(300)
    new = eventually(lambda: (r := ready_pods(kube, scene.ns, NAME)) and len(r) == 2
                     and not {p["metadata"]["name"] for p in r} & old and r, 300, "two new Ready pods", 0.5)
    timings["spec change -> rollout of 2 pods done (20 streams running)"] = time.monotonic() - started
    assert draining > 0, "no request was in flight on the old pod after its SIGTERM: the drain was not exercised"
    assert len(results) == ROLLOUT_STREAMS and pool.cut() == [], pool.cut()
    assert all("6" == c["args"][c["args"].index("--max-num-seqs") + 1] for p in new for c in p["spec"]["containers"])
    assert all("--speculative-method" in c["args"] for p in new for c in p["spec"]["containers"])
    timings["rollout: requests held by a terminating pod after its SIGTERM (count)"] = draining


def test_speculating_pods_serve_plain_greedy_text_through_the_service(kube: Any, scene: Scene) -> None:
    """The pods rolled out above verify drafts; what they stream is the demo model's plain greedy text, as the
    offline engine writes it on this machine (one CPU thread, as the pods' 250m gives them)."""
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    prompt, max_tokens = "pods pods pods serve serve serve pods pods pods serve", 48
    [expected] = LLM("demo", max_model_len=2048, cpu_threads=1).generate(
        prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    pods = ready_pods(kube, scene.ns, NAME)
    accepted_before = sum(pod_counter(p, "kubeinfer_spec_decode_num_accepted_tokens_total") for p in pods)
    for _ in range(2):   # kube-proxy picks a pod at random: likely both serve once
        result = streams.stream_completion(api(kube, scene), NAME, prompt, max_tokens)
        assert result.whole(max_tokens) and result.text == expected.text
    accepted = sum(pod_counter(p, "kubeinfer_spec_decode_num_accepted_tokens_total") for p in pods)
    assert accepted > accepted_before


def test_deleted_pod_is_replaced(kube: Any, scene: Scene, timings: dict[str, float]) -> None:
    victim = ready_pods(kube, scene.ns, NAME)[0]["metadata"]["name"]
    started = time.monotonic()
    kube.request("DELETE", f"/api/v1/namespaces/{scene.ns}/pods/{victim}")
    eventually(lambda: len(r := ready_pods(kube, scene.ns, NAME)) == 2 and victim not in
               {p["metadata"]["name"] for p in r}, 180, "a replacement pod Ready", 0.2)
    timings["pod deleted -> replacement Ready"] = time.monotonic() - started


def test_deployment_hand_edited_or_deleted_is_restored(kube: Any, scene: Scene, timings: dict[str, float]) -> None:
    dep_path = scene.path("deployments")
    kube.request("PATCH", dep_path, body={"spec": {"replicas": 5, "template": {"spec": {
        "terminationGracePeriodSeconds": 1}}}}, content_type=MERGE)
    eventually(lambda: (d := kube.get(dep_path))["spec"]["replicas"] == 2
               and d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 135, 60, "the edit reverted")
    old_uid = kube.get(dep_path)["metadata"]["uid"]
    started = time.monotonic()
    kube.request("DELETE", dep_path)
    eventually(lambda: (d := kube.get(dep_path)) and d["metadata"]["uid"] != old_uid, 60, "a new Deployment", 0.2)
    timings["Deployment deleted -> recreated"] = time.monotonic() - started
    eventually(lambda: len(ready_pods(kube, scene.ns, NAME)) == 2, 240, "its two pods Ready", 0.5)
    eventually(lambda: condition(kube.get(isvc_path(scene.ns, NAME)), "Progressing").get("reason") == "Complete",
               120, "Progressing Complete")


def owned(kube: Any, kind_path: str, uid: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in kube.list(kind_path)
                  if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []))


def versions(items: list[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}


def test_operator_restart_duplicates_nothing_and_a_resync_writes_nothing(kube: Any, scene: Scene) -> None:
    uid = kube.get(isvc_path(scene.ns, NAME))["metadata"]["uid"]
    paths = [isvc_path(scene.ns, NAME), scene.path("deployments"), scene.path("services"),
             scene.path("poddisruptionbudgets")]
    time.sleep(3)  # let the last pod status changes of the previous scenario reach the status

    def written() -> dict[str, Any]:
        """What the operator writes: every object whole (its resourceVersion), but the PDB's status is the
        disruption controller's, rewritten whenever a pod's health changes: for the PDB, what the operator
        owns (spec, through the generation, labels and annotations)."""
        out: dict[str, Any] = {}
        for p in paths:
            meta = kube.get(p)["metadata"]
            out[p] = ((meta["generation"], meta.get("labels"), meta.get("annotations")) if p == paths[3]
                      else meta["resourceVersion"])
        return out
    before = written()
    replica_sets = kube.list(f"/apis/apps/v1/namespaces/{scene.ns}/replicasets")
    log_mark = len(scene.operator.output())
    scene.operator.restart()
    eventually(lambda: "Handler 'reconcile_service' succeeded" in scene.operator.output()[log_mark:], 60,
               "the restarted operator's resume pass")
    time.sleep(5)  # and any pass its child watches trigger
    assert written() == before
    for kind_path in (f"/apis/apps/v1/namespaces/{scene.ns}/deployments", f"/api/v1/namespaces/{scene.ns}/services",
                      f"/apis/policy/v1/namespaces/{scene.ns}/poddisruptionbudgets"):
        assert owned(kube, kind_path, uid) == [NAME], kind_path
    assert versions(kube.list(f"/apis/apps/v1/namespaces/{scene.ns}/replicasets")) == versions(replica_sets)


def test_deletion_garbage_collects_every_child(kube: Any, scene: Scene, timings: dict[str, float]) -> None:
    assert not kube.get(isvc_path(scene.ns, NAME))["metadata"].get("finalizers")   # not autoscaled: none
    started = time.monotonic()
    kube.request("DELETE", isvc_path(scene.ns, NAME))
    eventually(lambda: kube.get(isvc_path(scene.ns, NAME)) is None, 60, "the InferenceService gone")
    for kind in ("deployments", "services", "poddisruptionbudgets"):
        eventually(lambda: kube.get(scene.path(kind)) is None, 60, f"{kind} collected")
    eventually(lambda: not pods_of(kube, scene.ns, NAME), 180, "the pods gone")
    timings["InferenceService deleted -> children and pods gone"] = time.monotonic() - started
    assert not [p for p in pods_of(kube, scene.ns, NAME) if is_ready(p)]
