"""What `kubectl` shows, on a real API server (skipped unless KUBEINFER_E2E_KUBECONFIG is set).

- One message per mistake: each bad field of an applied manifest gets one cause that names it and says what
  is allowed (the API server's own checks, the schema and the CEL rules do not repeat each other).
- `kubectl get infsvc` (the Table API that kubectl reads): READY, DESIRED, STATUS, MODEL, AGE; `-o wide` adds TP
  and ENDPOINT; DESIRED and TP are filled in for a spec that sets neither.
- `kubectl describe infsvc` (Events whose involvedObject is the object): a Warning for a service that cannot be
  scheduled, and the autoscaler's decisions (a scale from zero, a manual scale overridden).
- Times in status are RFC 3339.

No runtime image is needed: the pods only have to be scheduled or refused. The autoscaler reads a stand-in
router's /metrics on this machine's loopback (spec.autoscaling.routerMetricsUrl), as the operator runs here.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kubeinfer.operator import times
from kubeinfer.operator.spec import runtime as runtime_spec
from support.cluster import (condition, delete_inference_services, delete_namespace, eventually, isvc_path,
                             start_operator_in_process)

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
# Upper bounds of the waits (each returns as soon as what it waits for is seen): the scheduler's first
# attempt at a pod and the operator's pass on the pod's event; autoscaler passes, one per INTERVAL_S.
SCHEDULER_S = 60
INTERVAL_S = 1.0


@pytest.fixture()
def kctl_ns(kube: Any, crds: None) -> Iterator[str]:
    ns = f"kctl-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield ns
    delete_namespace(kube, ns)


def manifest(ns: str, name: str = "bad", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"uri": "pvc://models/qwen"}, **spec}}


def refusal(kube: Any, ns: str, **spec: Any) -> list[dict[str, str]]:
    """The causes of the API server's 422 for this spec: what `kubectl apply` prints, one line each."""
    from kubernetes.client import ApiException
    with pytest.raises(ApiException) as info:
        kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body=manifest(ns, **spec))
    assert info.value.status == 422, info.value.body
    return json.loads(info.value.body)["details"]["causes"]


MANAGED = f"must not set {runtime_spec._words(runtime_spec.MANAGED_FLAGS)}:"   # every flag the operator sets, named
ONE_MESSAGE = {
    # name: (spec, the field, words of its one message)
    "negative replicas": ({"replicas": -3}, ".spec.replicas", "should be a non-negative integer"),
    "negative replicas beside autoscaling": ({"replicas": -3, "autoscaling": {"maxReplicas": 4}}, ".spec.replicas",
                                             "should be a non-negative integer"),
    "replicas above the autoscaling bounds": ({"replicas": 9, "autoscaling": {"maxReplicas": 4}}, "spec",
                                              "spec.replicas must lie within [autoscaling.minReplicas, "
                                              "autoscaling.maxReplicas]"),
    "a flag the operator sets": ({"runtime": {"extraArgs": ["--port", "9000"]}}, "spec.runtime.extraArgs", MANAGED),
    "a flag the operator sets, with =": ({"runtime": {"extraArgs": ["--max-num-seqs=8", "--device=cuda"]}},
                                         "spec.runtime.extraArgs", MANAGED),
    "a variable the operator sets": ({"runtime": {"env": [{"name": "KUBEINFER_PORT", "value": "1"}]}},
                                     "spec.runtime.env", "runtime.env must not set KUBEINFER_MODEL"),
    "tensor 3": ({"parallelism": {"tensor": 3}}, "spec.parallelism.tensor", "must be a power of two between 1 and 64"),
    "expert over other GPUs than tensor": ({"parallelism": {"tensor": 2, "expert": 4}}, "spec.parallelism",
                                           "parallelism.expert must be 1, equal parallelism.tensor"),
    "negative minReplicas": ({"autoscaling": {"minReplicas": -1, "maxReplicas": 2}}, "spec.autoscaling.minReplicas",
                             "should be greater than or equal to 0"),
    "ftp model": ({"model": {"uri": "ftp://host/m"}}, "spec.model.uri", "must start with hf://, pvc://, s3:// or file://"),
    # spec.disaggregation (operator/spec/disaggregation.py)
    "disaggregation without a router": ({"disaggregation": {"prefill": {}, "decode": {}}}, "spec",
                                        "spec.disaggregation needs spec.router"),
    "disaggregation beside spec.replicas": ({"router": {}, "replicas": 2, "disaggregation": {"prefill": {},
                                                                                             "decode": {}}},
                                            "spec", "spec.replicas and spec.autoscaling do not apply"),
    "disaggregation with tensor parallelism": ({"router": {}, "parallelism": {"tensor": 2},
                                                "disaggregation": {"prefill": {}, "decode": {}}}, "spec",
                                               "runs with parallelism.tensor 1 and parallelism.expert 1"),
    "no decode replica for the prefill pool": ({"router": {}, "disaggregation": {"prefill": {"replicas": 1},
                                                                                 "decode": {"replicas": 0}}},
                                               "spec.disaggregation", "disaggregation.decode.replicas must be above 0"),
    "one pool autoscaled": ({"router": {}, "disaggregation": {"prefill": {"autoscaling": {"maxReplicas": 2}},
                                                              "decode": {}}},
                            "spec.disaggregation", "autoscale both pools or neither"),
    "one pool to zero": ({"router": {}, "disaggregation": {
        "prefill": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
        "decode": {"autoscaling": {"maxReplicas": 2}}}}, "spec.disaggregation", "are 0 together or not at all"),
    "the KV port on the HTTP port": ({"router": {}, "disaggregation": {"kvPort": 8000, "prefill": {}, "decode": {}}},
                                     "spec.disaggregation.kvPort", "disaggregation.kvPort must not be 8000"),
    "two GPUs in a pool": ({"router": {}, "disaggregation": {"prefill": {}, "decode": {"resources": {"gpus": 2}}}},
                           "spec.disaggregation.decode", "must be 0 (run on CPU) or 1"),
}


@pytest.mark.parametrize("case", sorted(ONE_MESSAGE))
def test_each_bad_field_gets_one_message(kube: Any, kctl_ns: str, case: str) -> None:
    spec, field, words = ONE_MESSAGE[case]
    causes = refusal(kube, kctl_ns, **spec)
    assert len(causes) == 1, causes
    assert causes[0]["field"] == field and words in causes[0]["message"], causes


def test_a_wrongly_typed_replicas_gets_the_type_error_and_only_the_api_servers_own_notes(
        kube: Any, kctl_ns: str) -> None:
    """`replicas: "two"`: the schema's type error is the message. The API server adds two lines of its own that no
    CRD can take away while it has a scale subresource (its spec.replicas check reads the field as an integer:
    "accessor error") and CEL rules (after a type error it runs none: "some validation rules were not checked").
    None of the CRD's own rules adds a line."""
    causes = refusal(kube, kctl_ns, replicas="two")
    fields = {c["field"]: c["message"] for c in causes}
    assert 'spec.replicas in body must be of type integer: "string"' in fields["spec.replicas"]
    own_notes = [c for c in causes if c["field"] != "spec.replicas"]
    assert all("accessor error" in c["message"] or "some validation rules were not checked" in c["message"]
               for c in own_notes), causes
    assert len(own_notes) <= 2, causes


class RouterMetrics:
    """A stand-in `kubeinfer router` /metrics on loopback: `waiting` requests queued for a replica."""

    def __init__(self) -> None:
        self.waiting = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = f"kubeinfer_router_queue_requests {outer.waiting}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture()
def operator_ns(kctl_ns: str, kube: Any) -> Iterator[str]:
    thread, stop = start_operator_in_process(kctl_ns, service_monitor="never", autoscale_interval_seconds=INTERVAL_S)
    # No wait for its watches: on a real API server an object created before them is listed, and handled, once.
    yield kctl_ns
    delete_inference_services(kube, kctl_ns)   # kopf's finalizer on autoscaled ones needs the operator running
    stop.set()
    thread.join(30)


def table(kube: Any, ns: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """`kubectl get infsvc -o wide` as the API server serves it: the columns, and each row's cells by column."""
    found = kube.request("GET", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", accept=TABLE)
    columns = found["columnDefinitions"]
    rows = {row["cells"][0]: dict(zip((c["name"] for c in columns), row["cells"])) for row in found["rows"]}
    return columns, rows


def events_of(kube: Any, ns: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events `kubectl describe` lists for the object (its field selector on the involved object's uid)."""
    return kube.request("GET", f"/api/v1/namespaces/{ns}/events",
                        query={"fieldSelector": f"involvedObject.uid={obj['metadata']['uid']}"}).get("items") or []


def test_get_columns_describe_events_and_times(kube: Any, operator_ns: str) -> None:
    ns = operator_ns
    path = f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices"
    # Asks for more GPUs than any node has (64 shards, one GPU each): the scheduler refuses its pod.
    big = kube.request("POST", path, body=manifest(ns, "too-big", parallelism={"tensor": 64}))
    # Sets neither replicas nor parallelism: DESIRED and TP must still show.
    plain = kube.request("POST", path, body=manifest(ns, "plain"))
    assert plain["spec"]["parallelism"] == {"expert": 1, "tensor": 1}   # the API server's defaults

    columns, rows = eventually(lambda: (t := table(kube, ns)) and all(r["Desired"] is not None for r in t[1].values())
                               and t, timeout=SCHEDULER_S, what="DESIRED filled in")
    assert [(c["name"], c["priority"]) for c in columns] == [
        ("Name", 0), ("Ready", 0), ("Desired", 0), ("Status", 0), ("Model", 0), ("Age", 0),
        ("TP", 1), ("Endpoint", 1), ("TTFT-P95", 1), ("Queue", 1)]
    assert (rows["plain"]["Desired"], rows["plain"]["TP"]) == (1, 1)
    assert rows["plain"]["Endpoint"] == f"http://plain.{ns}.svc/v1" and rows["plain"]["Status"]
    assert rows["too-big"]["TP"] == 64

    # The scheduler's refusal: one Warning Event for the conditions it changed, about the InferenceService.
    warning = eventually(lambda: next((e for e in events_of(kube, ns, big)
                                       if e["reason"] in ("InsufficientGPU", "Unschedulable")), None),
                         timeout=SCHEDULER_S, what="an Event for the pod that cannot be scheduled")
    assert warning["type"] == "Warning" and warning["source"]["component"] == "kubeinfer-operator"
    assert "Degraded=True" in warning["message"] and "cannot be scheduled" in warning["message"]
    assert warning["involvedObject"]["kind"] == "InferenceService"
    _, rows = table(kube, ns)
    assert rows["too-big"]["Status"] == warning["reason"]
    obj = kube.get(isvc_path(ns, "too-big"))
    assert all(RFC3339.match(c["lastTransitionTime"]) for c in obj["status"]["conditions"])


def test_autoscaler_decisions_are_events(kube: Any, operator_ns: str) -> None:
    ns = operator_ns
    router = RouterMetrics()
    try:
        scaling = {"minReplicas": 0, "maxReplicas": 2, "initialDelaySeconds": 0, "routerMetricsUrl": router.url}
        obj = kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices",
                           body=manifest(ns, "scaled", replicas=0, autoscaling=scaling,
                                         resources={"gpus": 0, "cpu": "100m", "memory": "256Mi"}))
        eventually(lambda: (kube.get(isvc_path(ns, "scaled"))["status"].get("lastSignals") or {}).get("reason"),
                   timeout=10 * INTERVAL_S + 30, what="the autoscaler's first pass")
        assert kube.get(isvc_path(ns, "scaled"))["spec"]["replicas"] == 0
        router.waiting = 3   # requests wait at the router: a replica is started
        up = eventually(lambda: next((e for e in events_of(kube, ns, obj) if e["reason"] == "ScaleFromZero"), None),
                        timeout=10 * INTERVAL_S, what="a ScaleFromZero Event")
        assert up["type"] == "Normal" and up["message"].startswith("0 -> 1 replicas")
        assert kube.get(isvc_path(ns, "scaled"))["spec"]["replicas"] == 1
        # kubectl scale while autoscaling is on: set back, and said so.
        kube.request("PATCH", isvc_path(ns, "scaled") + "/scale", body={"spec": {"replicas": 2}},
                     content_type="application/merge-patch+json")
        override = eventually(lambda: next((e for e in events_of(kube, ns, obj)
                                            if e["reason"] == "ManualScaleOverridden"), None),
                              timeout=10 * INTERVAL_S, what="a ManualScaleOverridden Event")
        assert "spec.replicas was set to 2 while autoscaling is on" in override["message"]
        st = kube.get(isvc_path(ns, "scaled"))["status"]
        # lastSignals carries no time (it would rewrite status every pass: docs/autoscaling.md, "Status writes")
        assert "timestamp" not in st["lastSignals"] and st["lastSignals"]["reason"]
        assert RFC3339.match(st["lastScaleTime"])
        history = st["scalingHistory"]
        assert RFC3339.match(history["startedAt"]) and all(RFC3339.match(e["time"]) for e in history["events"])
        assert st["desiredReplicas"] == kube.get(isvc_path(ns, "scaled"))["spec"]["replicas"]
        assert condition(kube.get(isvc_path(ns, "scaled")), "ScalingActive")
        # Autoscaling turned off: the autoscaler's memory goes (a merge patch's null), DESIRED follows the spec.
        kube.request("PATCH", isvc_path(ns, "scaled"), body={"spec": {"autoscaling": None, "replicas": 2}},
                     content_type="application/merge-patch+json")
        st = eventually(lambda: (s := kube.get(isvc_path(ns, "scaled"))["status"]) and "scalingHistory" not in s
                        and s.get("desiredReplicas") == 2 and s, timeout=10 * INTERVAL_S, what="scalingHistory gone")
        assert st["desiredReplicas"] == 2
    finally:
        router.close()


def test_a_repeated_event_raises_its_count_on_a_real_api_server(kube: Any, kctl_ns: str) -> None:
    """The recorder's aggregation as the API server stores it (kubectl describe: "(x2 over 30s)"): the second
    Event is a merge patch of the first one's count and lastTimestamp, allowed for our field manager."""
    from kubeinfer.operator.events import EventRecorder, EventSpec
    obj = kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{kctl_ns}/inferenceservices",
                       body=manifest(kctl_ns, "flappy"))
    now = time.time()
    clock = iter([now, now + 30]).__next__
    recorder = EventRecorder(clock=clock)
    spec = EventSpec("Warning", "CrashLoop", "Ready=False: pod flappy-0 keeps crashing")
    recorder.record(kube, obj, [spec])
    recorder.record(kube, obj, [spec])
    (event,) = events_of(kube, kctl_ns, obj)
    assert (event["count"], event["reason"], event["message"]) == (2, "CrashLoop", spec.message)
    assert times.unix(event["lastTimestamp"]) - times.unix(event["firstTimestamp"]) == 30
