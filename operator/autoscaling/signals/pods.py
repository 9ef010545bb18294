"""What the autoscaler reads from a service's pods: which are live and Ready, the replica counts the policies decide
from, and the /metrics each Ready pod serves (the direct scrape's targets).
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.autoscaling.signals.cold_start import parse_time, ready_condition
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts
from kubeinfer.operator.autoscaling.signals.scrape_source import ScrapeTarget
from kubeinfer.operator.reconcile import pod as pod_builder
from kubeinfer.operator.reconcile.router import serving_pods

# Labels that the Prometheus Operator attaches to series scraped through our ServiceMonitor.
PROMETHEUS_LABELS = ("namespace", "service")


def is_ready(pod: dict[str, Any]) -> bool:
    ready = ready_condition(pod)
    return ready is not None and ready.get("status") == "True"


def live_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods that are not being deleted."""
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def replica_counts(current: int, pods: list[dict[str, Any]], initial_delay_s: float, now: float) -> ReplicaCounts:
    """Ready = Ready condition and created at least initialDelaySeconds ago (a real API server always sets
    creationTimestamp; without one a pod counts as old). Pending = the rest of the larger of the desired
    count and the live pods: replicas the Deployment has not created yet are pending too."""
    live = live_pods(pods)
    ready = 0
    for p in live:
        created = parse_time((p.get("metadata") or {}).get("creationTimestamp"))
        if is_ready(p) and (created is None or now - created >= initial_delay_s):
            ready += 1
    return ReplicaCounts(current=current, ready=ready, pending=max(current, len(live)) - ready)


def scrape_targets(pods: list[dict[str, Any]]) -> dict[str, ScrapeTarget]:
    """/metrics of the ready pods (a loading pod is not listening yet and runs no requests), each with the time it
    became Ready (its Ready condition's lastTransitionTime; None if unset), from when it has served requests (the
    scrape reads a pod from zero only if that was within its window), and its uid (`ScrapeSource`)."""
    return {f"http://{p['status']['podIP']}:{pod_builder.PORT}/metrics":
            ScrapeTarget(_ready_since(p), (p.get("metadata") or {}).get("uid")) for p in serving_pods(pods)}


def _ready_since(pod: dict[str, Any]) -> float | None:
    ready = ready_condition(pod)
    return None if ready is None else parse_time(ready.get("lastTransitionTime"))
