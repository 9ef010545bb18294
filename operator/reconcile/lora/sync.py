"""The one I/O step of adapters: each ready replica's runtime is asked what it serves (`GET /lora/adapters`, open
like /metrics: no API key, so the operator reads no Secret), at `http://POD_IP:8000` as the autoscaler's scrape
reaches the pods. The operator never loads or unloads: each replica follows the list its fetcher writes from the
ConfigMap (`--lora-modules-file`, runtime/server/lora_file.py; reconcile.lora.fetch), and this step reports how far
each got.

Rules:
- Only ready replicas, not being deleted: a loading one does not listen yet.
- An adapter is ready on a replica when the replica serves it from the folder the spec's URI maps to; served from
  another folder (its URI changed) or not yet: not ready, with why (the kubelet refreshes the mounted list within
  about a minute, then the fetcher downloads it); refused: not ready, with the runtime's words.
- Nothing here raises for a replica: an unreachable one is recorded as such, and the others are still read.
- When the list changes, each replica pod gets the list's hash in an annotation (`nudge`): a pod update makes the
  kubelet refresh the pod's mounted ConfigMap now rather than at its next periodic sync (up to about a minute), so
  an adapter added or removed reaches the replicas within the fetcher's round and the runtime's poll.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

import httpx

from kubeinfer.operator.kube import Kube
from kubeinfer.operator.reconcile import pod as pod_builder
from kubeinfer.operator.spec import GROUP

log = logging.getLogger(__name__)

PORT = pod_builder.PORT
LIST_ANNOTATION = f"{GROUP}/adapters-list"
TIMEOUT = httpx.Timeout(10.0, connect=2.0)
WHY_PENDING = ("the replica loads it once its adapters list (refreshed by the kubelet within about a minute) names "
               "it and the fetcher has downloaded it")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One adapter on one ready replica after this pass."""

    pod: str
    adapter: str
    ready: bool
    message: str = ""


def ready_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods that serve: Ready, with an IP, not being deleted; by name."""
    def ready(p: dict[str, Any]) -> bool:
        status = p.get("status") or {}
        return bool(status.get("podIP")) and not (p.get("metadata") or {}).get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return sorted((p for p in pods if ready(p)), key=lambda p: p["metadata"]["name"])


def outcomes_of(pod: str, served: list[dict[str, Any]], desired: dict[str, str]) -> list[Outcome]:
    """One Outcome per desired adapter from a replica's /lora/adapters entries ({name, path, loaded, message})."""
    by_name = {entry.get("name"): entry for entry in served if isinstance(entry, dict)}
    result = []
    for name, folder in desired.items():
        entry = by_name.get(name)
        if entry is None:
            result.append(Outcome(pod, name, False, f"not loaded yet: {WHY_PENDING}"))
        elif entry.get("path") != folder:
            result.append(Outcome(pod, name, False,
                                  f"still served from {entry.get('path')}, not {folder}: {WHY_PENDING}"))
        elif entry.get("loaded"):
            result.append(Outcome(pod, name, True))
        else:
            result.append(Outcome(pod, name, False, str(entry.get("message") or "refused by the runtime")))
    return result


def read_replica(client: httpx.Client, url: str) -> list[dict[str, Any]]:
    response = client.get(f"{url}/lora/adapters")
    response.raise_for_status()
    return list(response.json()["adapters"])


def sync(pods: list[dict[str, Any]], desired: dict[str, str]) -> list[Outcome]:
    """Every ready replica's adapters against `desired`; one Outcome per (ready replica, adapter)."""
    outcomes: list[Outcome] = []
    with httpx.Client(timeout=TIMEOUT) as client:
        for p in ready_pods(pods):
            name = p["metadata"]["name"]
            try:
                served = read_replica(client, f"http://{p['status']['podIP']}:{PORT}")
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as error:
                log.warning("adapters: replica %s: %s", name, error)
                outcomes += [Outcome(name, a, False, f"cannot reach the runtime: {error}") for a in desired]
                continue
            outcomes += outcomes_of(name, served, desired)
    return outcomes


def list_hash(desired: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(desired, sort_keys=True).encode()).hexdigest()[:16]


def nudge(kube: Kube, namespace: str, pods: list[dict[str, Any]], desired: dict[str, str]) -> int:
    """Writes the list's hash into each replica pod's annotation where it differs (not on pods being deleted);
    returns the writes."""
    wanted, writes = list_hash(desired), 0
    for p in pods:
        meta = p.get("metadata") or {}
        if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get(LIST_ANNOTATION) == wanted:
            continue
        if kube.annotate_pod(namespace, meta["name"], {LIST_ANNOTATION: wanted}):
            writes += 1
    return writes
