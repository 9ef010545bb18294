"""The autoscaler's write step (`Autoscaler._decide_and_write`) over scripted passes, against an in-memory
object that stores its status as the API server does (a JSON merge patch: null members removed), counting the
status writes. A "restart" is a fresh `Autoscaler`: it knows only what the stored object holds."""

from __future__ import annotations

import copy
import dataclasses
import threading
import types
from typing import Any

from kubeinfer.operator.autoscaling.autoscaler import Autoscaler, Plan
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.times import rfc3339

NAME, NAMESPACE = "x", "ns"
INTERVAL = 5.0
T0 = 1_800_000_000.0


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch of `patch` onto `target`."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = _merge(out.get(key) if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclasses.dataclass
class StoredService:
    """One InferenceService and its pods (one Ready pod per spec.replicas, an hour old), as a Kube would serve
    them; `status_writes` counts the PATCHes of its status."""

    body: dict[str, Any]
    now: float = T0
    status_writes: int = 0

    def get(self, path: str) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def list(self, path: str, selector: str) -> list[dict[str, Any]]:
        created = rfc3339(T0 - 3600)
        return [{"metadata": {"name": f"{NAME}-{i}", "creationTimestamp": created,
                              "labels": {"kubeinfer.dev/inferenceservice": NAME,
                                         "app.kubernetes.io/managed-by": "kubeinfer"}},
                 "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}
                for i in range(self.body["spec"].get("replicas") or 0)]

    def patch_status(self, path: str, patch: dict[str, Any]) -> None:
        self.status_writes += 1
        self.body = _merge(self.body, {"status": patch})

    def request(self, method: str, path: str, body: dict[str, Any], **_: Any) -> None:
        assert method == "PATCH"
        self.body = _merge(self.body, body)


class _Context:
    def __init__(self, kube: StoredService) -> None:
        self.kube, self.events, self._lock = kube, self, threading.Lock()
        self.config = types.SimpleNamespace(autoscale_interval_seconds=INTERVAL)

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        return self._lock

    def record(self, kube: Any, body: Any, events: Any) -> None:
        pass


@dataclasses.dataclass
class _Readers:
    prometheus: Any = True   # signals come from the script, never read
    scrape_client: Any = None
    router_client: Any = None


def service(replicas: int = 2, **autoscaling: Any) -> StoredService:
    scaling = {"minReplicas": 1, "maxReplicas": 8, "targetQueueDepthPerReplica": 2, "initialDelaySeconds": 0,
               "metricWindowSeconds": 30, "scaleDownStabilizationSeconds": 60, **autoscaling}
    return StoredService({
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "u1", "generation": 1,
                     "labels": {}},
        "spec": {"model": {"uri": "pvc://m/x"}, "replicas": replicas, "autoscaling": scaling}, "status": {}})


def autoscaler(stored: StoredService) -> Autoscaler:
    scaler = Autoscaler(_Context(stored), NAMESPACE, NAME, readers=_Readers())  # type: ignore[arg-type]
    scaler.clock = lambda: stored.now
    return scaler


def idle(now: float) -> Signals:
    return Signals(now, queue_depth=0.0, num_running=0.0, request_rate=0.0, num_pods_reporting=2)


def run(stored: StoredService, script: list[Any], restart_at: int | None = None,
        start: int = 0) -> tuple[list[Plan], list[int]]:
    """One pass per entry of `script` (a function of the pass time giving its Signals), INTERVAL apart, from pass
    `start`; a fresh Autoscaler from pass `restart_at` on. Returns the plan and the status writes (0 or 1) of
    each pass."""
    scaler, plans, writes = autoscaler(stored), [], []
    for i, signals in enumerate(script):
        if i == restart_at:
            scaler = autoscaler(stored)
        stored.now = T0 + INTERVAL * (start + i)
        before = stored.status_writes
        plan = scaler._decide_and_write(signals(stored.now))
        assert plan is not None
        plans.append(plan)
        writes.append(stored.status_writes - before)
    return plans, writes


def desired(plans: list[Plan]) -> list[int]:
    return [p.decision.desired_replicas for p in plans]
