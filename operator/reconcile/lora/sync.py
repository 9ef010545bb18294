"""The one I/O step of adapters: each ready replica's runtime is asked what it has loaded (`GET /v1/models`) and
told to load what the spec adds and unload what it drops (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`,
docs/lora.md), at `http://POD_IP:8000` as the autoscaler's scrape reaches the pods.

Rules:
- Only ready replicas, not being deleted: a loading one does not listen yet; a new one starts with every adapter
  its fetcher had (reconcile.lora.fetch), and this step adds the rest once it is ready.
- An adapter loaded under another folder (its uri changed) is unloaded, then loaded from the new folder.
- An adapter the runtime has that the spec does not list is unloaded; a 404 there means it is already gone.
- A refusal (400: no such folder, rank too high, another base model...) is recorded with the runtime's message
  and retried on the next pass: a folder still being fetched reads as "no such folder" until it is complete.
- Nothing here raises for a replica: an unreachable one is recorded as such, and the others are still served.
- With `spec.apiKeySecretRef`, the first key of that Secret authorizes the calls (the endpoints sit behind the
  API keys like every /v1 route).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from typing import Any

import httpx
from kubernetes.client import ApiException

from kubeinfer.operator.kube import Kube, resource_path
from kubeinfer.operator.reconcile import pod as pod_builder

log = logging.getLogger(__name__)

PORT = pod_builder.PORT
TIMEOUT = httpx.Timeout(60.0, connect=2.0)   # loading reads the adapter's weights


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


def api_key(kube: Kube, namespace: str, secret: str, key: str) -> str | None:
    """The first key of the API keys file in the Secret (a line's first word; docs/server.md)."""
    try:
        body = kube.get(resource_path("v1", "Secret", namespace, secret))
    except ApiException as e:
        log.warning("adapters: cannot read Secret %s/%s: %s %s", namespace, secret, e.status, e.reason)
        return None
    raw = ((body or {}).get("data") or {}).get(key)
    if raw is None:
        return None
    for line in base64.b64decode(raw).decode(errors="replace").splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            return words[0]
    return None


def _message(response: httpx.Response) -> str:
    """The runtime's words: an OpenAI-style error's message, else the body."""
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("message") or body["error"])
    except ValueError:
        pass
    return response.text.strip()[:500] or f"HTTP {response.status_code}"


class Replica:
    """The LoRA endpoints of one replica's runtime."""

    def __init__(self, client: httpx.Client, url: str):
        self.client, self.url = client, url

    def loaded(self) -> dict[str, str]:
        """Adapter name -> its folder, from /v1/models (the entries with a parent)."""
        response = self.client.get(f"{self.url}/v1/models")
        response.raise_for_status()
        return {m["id"]: str(m.get("root") or "") for m in response.json().get("data") or []
                if m.get("parent") is not None}

    def load(self, name: str, path: str) -> tuple[bool, str]:
        response = self.client.post(f"{self.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        return response.status_code == 200, "" if response.status_code == 200 else _message(response)

    def unload(self, name: str) -> tuple[bool, str]:
        response = self.client.post(f"{self.url}/v1/unload_lora_adapter", json={"lora_name": name})
        return response.status_code in (200, 404), _message(response) if response.status_code not in (200, 404) else ""


def sync_replica(replica: Replica, desired: dict[str, str]) -> dict[str, tuple[bool, str]]:
    """Make one replica hold exactly `desired` (name -> folder); returns adapter -> (loaded, message)."""
    have = replica.loaded()
    for name in sorted(set(have) - set(desired)):
        ok, message = replica.unload(name)
        log.info("adapters: unloaded %s from %s" if ok else "adapters: unloading %s from %s failed: %s",
                 name, replica.url, *([] if ok else [message]))
    result: dict[str, tuple[bool, str]] = {}
    for name, path in desired.items():
        if have.get(name) == path:
            result[name] = (True, "")
            continue
        if name in have:   # loaded from another folder: its uri changed
            replica.unload(name)
        result[name] = replica.load(name, path)
        if result[name][0]:
            log.info("adapters: loaded %s on %s from %s", name, replica.url, path)
    return result


def sync(pods: list[dict[str, Any]], desired: dict[str, str], key: str | None = None) -> list[Outcome]:
    """Every ready replica made to hold `desired`; one Outcome per (ready replica, adapter)."""
    outcomes: list[Outcome] = []
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=TIMEOUT, headers=headers) as client:
        for p in ready_pods(pods):
            name = p["metadata"]["name"]
            replica = Replica(client, f"http://{p['status']['podIP']}:{PORT}")
            try:
                result = sync_replica(replica, desired)
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as error:
                log.warning("adapters: replica %s: %s", name, error)
                result = {a: (False, f"cannot reach the runtime: {error}") for a in desired}
            outcomes += [Outcome(name, adapter, ok, message) for adapter, (ok, message) in result.items()]
    return outcomes
