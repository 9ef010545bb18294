"""InferenceService objects, pods and settled statuses for the autoscaler's pure pass (`autoscaler.plan_pass`)."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.autoscaling import autoscaler
from kubeinfer.operator.autoscaling.policies.types import ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.spec import parse_spec
from kubeinfer.operator.times import rfc3339 as iso

NOW = 1_800_000_000.0


def body(replicas: int | None = 2, status: dict[str, Any] | None = None, **autoscaling: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"uri": "pvc://m/x"},
                            "autoscaling": {"maxReplicas": 8, "targetQueueDepthPerReplica": 2,
                                            "initialDelaySeconds": 60, **autoscaling}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "x", "namespace": "ns", "uid": "u1", "generation": 3},
            "spec": spec, "status": status or {}}


def pod(name: str, ready: bool = True, age: float = 3600, ip: str | None = "10.0.0.1",
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": iso(NOW - age)}
    if deleting:
        meta["deletionTimestamp"] = iso(NOW)
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def plan(b: dict[str, Any], signals: Signals, pods: list[dict[str, Any]]) -> autoscaler.Plan:
    return autoscaler.plan_pass(b, parse_spec(b["spec"]), signals, pods, NOW)


def settled_status(desired: int) -> dict[str, Any]:
    hist = ScaleHistory(started_at=NOW - 3600, last_ready=desired, ready_changed_at=NOW - 3600,
                        last_traffic_time=NOW)
    return {"desiredReplicas": desired, "scalingHistory": hist.to_dict(),
            "conditions": [{"type": "Ready", "status": "True", "reason": "Available", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
