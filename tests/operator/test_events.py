"""Events about InferenceServices (operator.events): which condition changes make one, and how repeats are
aggregated and rate-limited. The recorder writes through a stand-in client that keeps every request."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import ApiException

from kubeinfer.operator import events
from kubeinfer.operator.events import EventRecorder, EventSpec, condition_events

NOW = 1_800_000_000.0
OBJ = {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
       "metadata": {"name": "qwen", "namespace": "ns", "uid": "u1"}}
EVENTS = "/api/v1/namespaces/ns/events"


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2027-01-15T08:00:00Z"}


class FakeKube:
    """Keeps the requests; answers 404 to a PATCH of an Event named in `expired`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.expired: set[str] = set()
        self.fail_with: int | None = None

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if self.fail_with is not None:
            raise ApiException(status=self.fail_with, reason="Forbidden")
        if method == "PATCH" and path.rsplit("/", 1)[-1] in self.expired:
            raise ApiException(status=404, reason="Not Found")
        self.requests.append((method, path, body))
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


# --- which changes make an Event -------------------------------------------------------------------------

def test_conditions_changing_together_for_one_reason_make_one_warning() -> None:
    old = [cond("Ready", "False", "LoadingModel", "0/1 replicas ready"),
           cond("Progressing", "True", "LoadingModel", "0/1 replicas ready"),
           cond("Degraded", "False", "AsExpected", "no problems observed")]
    why = "pod qwen-0 cannot be scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    new = [cond("Ready", "False", "InsufficientGPU", why), cond("Progressing", "True", "InsufficientGPU", why),
           cond("Degraded", "True", "InsufficientGPU", why)]
    assert condition_events(old, new) == [
        EventSpec("Warning", "InsufficientGPU", f"Ready=False, Progressing=True, Degraded=True: {why}")]


def test_unchanged_conditions_make_no_event_and_a_new_message_alone_is_no_change() -> None:
    old = [cond("Ready", "True", "Available", "1/2 replicas ready")]
    assert condition_events(old, [cond("Ready", "True", "Available", "2/2 replicas ready")]) == []


def test_a_recovery_is_a_normal_event_per_reason() -> None:
    old = [cond("Ready", "False", "CrashLoop", "boom"), cond("Degraded", "True", "CrashLoop", "boom")]
    new = [cond("Ready", "True", "Available", "1/1 replicas ready"),
           cond("Degraded", "False", "AsExpected", "no problems observed")]
    assert condition_events(old, new) == [EventSpec("Normal", "Available", "Ready=True: 1/1 replicas ready"),
                                          EventSpec("Normal", "AsExpected", "Degraded=False: no problems observed")]


def test_first_conditions_are_news_only_when_they_report_a_problem() -> None:
    start = [cond("Ready", "False", "Creating", "creating the Deployment"),
             cond("Degraded", "False", "AsExpected", "no problems observed")]
    assert condition_events([], start) == []
    invalid = [cond("Ready", "False", "InvalidSpec", "resources.memory 'lots' is not a Kubernetes quantity")]
    assert condition_events([], invalid) == [
        EventSpec("Warning", "InvalidSpec", "Ready=False: resources.memory 'lots' is not a Kubernetes quantity")]


def test_autoscaler_conditions_make_an_event_on_a_new_status_only() -> None:
    old = [cond("ScalingActive", "True", "WithinTolerance", "a"), cond("MetricsAvailable", "True", "SignalsRead", "q")]
    # every pass has a reason of its own: not news (a change of replicas has its own Event)
    assert condition_events(old, [cond("ScalingActive", "True", "StabilizingDown", "b"), old[1]]) == []
    held = [cond("ScalingActive", "False", "MetricsUnavailable", "no series"),
            cond("MetricsAvailable", "False", "MetricsUnavailable", "no series")]
    assert condition_events(old, held) == [
        EventSpec("Warning", "MetricsUnavailable", "ScalingActive=False, MetricsAvailable=False: no series")]


# --- the recorder ----------------------------------------------------------------------------------------

def test_the_first_event_is_a_core_v1_event_about_the_object() -> None:
    kube, clock = FakeKube(), Clock()
    EventRecorder(clock=clock).record(kube, OBJ, [EventSpec("Warning", "InsufficientGPU", "x" * 2000)])
    ((method, path, body),) = kube.requests
    assert (method, path) == ("POST", EVENTS)
    assert body["involvedObject"] == {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
                                      "name": "qwen", "namespace": "ns", "uid": "u1"}
    assert (body["type"], body["reason"], len(body["message"]), body["count"]) == ("Warning", "InsufficientGPU",
                                                                                   1024, 1)
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2027-01-15T08:00:00Z"
    assert body["source"] == {"component": "kubeinfer-operator"}
    assert body["metadata"]["namespace"] == "ns" and body["metadata"]["name"].startswith("qwen.")


def test_a_repeat_raises_the_count_of_the_first_event() -> None:
    kube, clock = FakeKube(), Clock()
    recorder = EventRecorder(clock=clock)
    flap = EventSpec("Warning", "CrashLoop", "Ready=False: pod qwen-0 keeps crashing")
    recorder.record(kube, OBJ, [flap])
    clock.now += 30
    recorder.record(kube, OBJ, [EventSpec("Normal", "Available", "Ready=True: 1/1 replicas ready")])
    clock.now += 30
    recorder.record(kube, OBJ, [flap])
    first = kube.requests[0][2]["metadata"]["name"]
    assert [(m, p.rsplit("/", 1)[-1] if m == "PATCH" else p) for m, p, _ in kube.requests] == [
        ("POST", EVENTS), ("POST", EVENTS), ("PATCH", first)]
    assert kube.requests[2][2] == {"count": 2, "lastTimestamp": "2027-01-15T08:01:00Z"}


def test_a_repeat_after_the_aggregation_window_is_a_new_event() -> None:
    kube, clock = FakeKube(), Clock()
    recorder = EventRecorder(clock=clock, aggregate_seconds=600)
    spec = EventSpec("Warning", "CrashLoop", "boom")
    recorder.record(kube, OBJ, [spec])
    clock.now += 601
    recorder.record(kube, OBJ, [spec])
    assert [m for m, _, _ in kube.requests] == ["POST", "POST"]
    assert kube.requests[0][2]["metadata"]["name"] != kube.requests[1][2]["metadata"]["name"]


def test_an_expired_event_is_created_again() -> None:
    kube, clock = FakeKube(), Clock()
    recorder = EventRecorder(clock=clock)
    spec = EventSpec("Warning", "CrashLoop", "boom")
    recorder.record(kube, OBJ, [spec])
    kube.expired.add(kube.requests[0][2]["metadata"]["name"])
    recorder.record(kube, OBJ, [spec])
    assert [m for m, _, _ in kube.requests] == ["POST", "POST"]
    assert kube.requests[1][2]["count"] == 1


def test_a_flapping_condition_is_rate_limited_per_object() -> None:
    kube, clock = FakeKube(), Clock()
    recorder = EventRecorder(burst=4, refill_seconds=60, clock=clock)
    for i in range(20):   # a condition flapping every second, with a new message each time
        recorder.record(kube, OBJ, [EventSpec("Warning", "CrashLoop", f"restart {i}")])
        clock.now += 1
    assert len(kube.requests) == 4
    clock.now += 60 - 20 + 4   # one token back: one more write
    recorder.record(kube, OBJ, [EventSpec("Warning", "CrashLoop", "restart 20")])
    recorder.record(kube, OBJ, [EventSpec("Warning", "CrashLoop", "restart 21")])
    assert len(kube.requests) == 5
    # another object has its own budget
    other = {**OBJ, "metadata": {**OBJ["metadata"], "name": "other", "uid": "u2"}}
    recorder.record(kube, other, [EventSpec("Warning", "CrashLoop", "restart 0")])
    assert len(kube.requests) == 6


def test_events_made_in_one_clock_tick_get_different_names() -> None:
    kube = FakeKube()
    recorder = EventRecorder(clock=Clock())
    recorder.record(kube, OBJ, [EventSpec("Normal", "A", "a"), EventSpec("Normal", "B", "b")])
    names = {body["metadata"]["name"] for _, _, body in kube.requests}
    assert len(names) == 2


def test_a_refused_write_is_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    kube.fail_with = 403
    EventRecorder(clock=Clock()).record(kube, OBJ, [EventSpec("Warning", "CrashLoop", "boom")])
    assert "cannot write the Event CrashLoop of ns/qwen: 403" in caplog.text


def test_event_types() -> None:
    assert events.event_type("InsufficientGPU") == "Warning"
    assert events.event_type("InvalidSpec") == "Warning"
    assert events.event_type("Available") == "Normal"
    assert events.event_type("ScaleUp") == "Normal"
