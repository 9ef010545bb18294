"""Kubernetes Events about InferenceServices: what `kubectl describe infsvc` lists under Events.

What makes an Event (policy):
- A condition change. Ready, Progressing and Degraded: a new status or a new reason. ScalingActive and
  MetricsAvailable: a new status only; their reasons follow every autoscaler pass, and a pass that changes
  replicas has an Event of its own.
- A condition that appears for the first time only when it reports a problem: a new object's first
  conditions are its normal start, not news.
- Conditions that change together with the same reason and message make one Event
  (`Ready=False, Degraded=True: pod ... cannot be scheduled: ...`).
- Each autoscaler decision that changes replicas or overrides a manual scale (autoscaling.autoscaler).
- Warning for problem reasons (`WARNING_REASONS`), Normal otherwise.

What keeps them from flooding the API server (as client-go's EventCorrelator does for the kubelet):
- Aggregation: the same (object, type, reason, message) again within `AGGREGATE_SECONDS` patches the first
  Event's `count` and `lastTimestamp` (`kubectl describe`: "(x4 over 3m)") instead of creating another.
- A token bucket per object: at most `BURST` writes, then one per `REFILL_SECONDS`; what it drops is logged.
  A condition that flaps every second costs the API server BURST writes, then one per five minutes.
- A failed write is logged and never fails the pass: the status already says the same.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes.client import ApiException

from kubeinfer.operator.kube import FIELD_MANAGER, MERGE_PATCH, Kube
from kubeinfer.operator.spec import API_VERSION, KIND
from kubeinfer.operator.times import rfc3339

log = logging.getLogger(__name__)

SOURCE = "kubeinfer-operator"
# client-go's defaults (tools/record: spam filter burst 25, one token per 5 minutes; 10-minute aggregation).
BURST = 25
REFILL_SECONDS = 300.0
AGGREGATE_SECONDS = 600.0
MAX_KEYS = 4096   # remembered Events (an LRU, as client-go's cache)
MAX_MESSAGE = 1024

# Conditions whose status alone makes an Event (their reason changes with every autoscaler decision).
STATUS_ONLY = frozenset({"ScalingActive", "MetricsAvailable"})
WARNING_REASONS = frozenset({"InvalidSpec", "ImagePullFailed", "CrashLoop", "ContainerConfigError", "InsufficientGPU",
                             "Unschedulable", "ProgressDeadlineExceeded", "ReplicaFailure", "MetricsUnavailable",
                             "MetricsStale", "AdapterFailed"})


@dataclasses.dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


def event_type(reason: str) -> str:
    return "Warning" if reason in WARNING_REASONS else "Normal"


def _changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    if old is None:
        return event_type(new.get("reason", "")) == "Warning"
    if old.get("status") != new.get("status"):
        return True
    return new.get("type") not in STATUS_ONLY and old.get("reason") != new.get("reason")


def condition_events(old: Iterable[dict[str, Any]], new: Iterable[dict[str, Any]]) -> list[EventSpec]:
    """The Events of the conditions in `new` that changed from `old` (both lists of conditions)."""
    before = {c.get("type"): c for c in old}
    grouped: dict[tuple[str, str], list[str]] = {}
    for cond in new:
        if _changed(before.get(cond.get("type")), cond):
            key = (cond.get("reason", ""), cond.get("message", ""))
            grouped.setdefault(key, []).append(f"{cond.get('type')}={cond.get('status')}")
    return [EventSpec(event_type(reason), reason, f"{', '.join(types)}: {message}" if message else ", ".join(types))
            for (reason, message), types in grouped.items()]


def event_body(obj: dict[str, Any], event: EventSpec, now: float, seq: int = 0) -> dict[str, Any]:
    """A core/v1 Event about `obj`, named as client-go names them (object name + hex nanoseconds; `seq` is
    added to the nanoseconds, so Events made within one clock tick get different names)."""
    meta = obj["metadata"]
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{int(now * 1e9) + seq:x}", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": obj.get("apiVersion", API_VERSION), "kind": obj.get("kind", KIND),
                           "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
        "type": event.type, "reason": event.reason, "message": event.message[:MAX_MESSAGE],
        "source": {"component": SOURCE}, "reportingComponent": SOURCE,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


@dataclasses.dataclass
class _Sent:
    name: str
    count: int
    last: float


@dataclasses.dataclass
class _Bucket:
    tokens: float
    at: float


class EventRecorder:
    """Posts Events, aggregating repeats and limiting writes per object; one per operator process (thread-safe)."""

    def __init__(self, burst: int = BURST, refill_seconds: float = REFILL_SECONDS,
                 aggregate_seconds: float = AGGREGATE_SECONDS, clock: Callable[[], float] = time.time) -> None:
        self.burst, self.refill_seconds = burst, refill_seconds
        self.aggregate_seconds, self.clock = aggregate_seconds, clock
        self._sent: collections.OrderedDict[tuple[str, ...], _Sent] = collections.OrderedDict()
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def _take(self, uid: str, now: float) -> bool:
        bucket = self._buckets.setdefault(uid, _Bucket(float(self.burst), now))
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) / self.refill_seconds)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def record(self, kube: Kube, obj: dict[str, Any], events: Iterable[EventSpec]) -> None:
        for event in events:
            try:
                self._record_one(kube, obj, event)
            except ApiException as e:
                log.warning("cannot write the Event %s of %s/%s: %s %s", event.reason, obj["metadata"]["namespace"],
                            obj["metadata"]["name"], e.status, e.reason)

    def _record_one(self, kube: Kube, obj: dict[str, Any], event: EventSpec) -> None:
        meta = obj["metadata"]
        uid = meta.get("uid") or f"{meta['namespace']}/{meta['name']}"
        key = (uid, event.type, event.reason, event.message[:MAX_MESSAGE])
        with self._lock:
            now = self.clock()
            if not self._take(uid, now):
                log.info("Event dropped (rate limit) %s/%s %s: %s", meta["namespace"], meta["name"], event.reason,
                         event.message)
                return
            sent = self._sent.get(key)
            if sent is not None and now - sent.last > self.aggregate_seconds:
                sent = None
            if sent is not None:
                sent.count += 1
                sent.last = now
                self._sent.move_to_end(key)
                count, name = sent.count, sent.name
            else:
                body = event_body(obj, event, now, next(self._seq))
                name, count = body["metadata"]["name"], 1
                self._sent[key] = _Sent(name, 1, now)
                while len(self._sent) > MAX_KEYS:
                    self._sent.popitem(last=False)
        events_path = f"/api/v1/namespaces/{meta['namespace']}/events"
        if count == 1:
            kube.request("POST", events_path, body=body, query={"fieldManager": FIELD_MANAGER})
            return
        try:
            kube.request("PATCH", f"{events_path}/{name}", body={"count": count, "lastTimestamp": rfc3339(now)},
                         content_type=MERGE_PATCH, query={"fieldManager": FIELD_MANAGER})
        except ApiException as e:
            if e.status != 404:
                raise
            # The API server expired it (events live an hour by default): start a new one.
            body = event_body(obj, event, now, next(self._seq))
            with self._lock:
                self._sent[key] = _Sent(body["metadata"]["name"], 1, now)
            kube.request("POST", events_path, body=body, query={"fieldManager": FIELD_MANAGER})
