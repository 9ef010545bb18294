"""What the real-cluster tests read of a router the operator deploys (`spec.router`): its pods, the replicas the
operator told them, and /metrics pages (of a router pod or a replica), straight to the pod addresses.
"""
from __future__ import annotations

import json
from typing import Any

import httpx

from support.cluster import ready_pods

ROUTER_LABEL = "kubeinfer.dev/router"
ENDPOINTS_ANNOTATION = "kubeinfer.dev/router-endpoints"


def router_pods(kube: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in kube.list(f"/api/v1/namespaces/{ns}/pods", f"{ROUTER_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]


def told(pod: dict[str, Any]) -> list[str] | None:
    value = (pod["metadata"].get("annotations") or {}).get(ENDPOINTS_ANNOTATION)
    return None if value is None else sorted(json.loads(value))


def replica_urls(kube: Any, ns: str, name: str) -> list[str]:
    return sorted(f"http://{p['status']['podIP']}:8000" for p in ready_pods(kube, ns, name))


def metrics(url: str) -> dict[str, float]:
    """A /metrics page as {'name{labels}': value} (labels as printed)."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum of one metric's samples, of those with these labels."""
    return sum(v for k, v in values.items() if (k == name or k.startswith(name + "{"))
               and all(f'{key}="{value}"' in k for key, value in labels.items()))
