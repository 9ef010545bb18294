"""Helpers of the operator tests: serve an emulated API server (kmock), run the operator against it, talk
to it, count writes. Imported as ``support.operator_harness``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kmock as kmock_lib
import kopf
import pytest
import yaml

from kubeinfer.operator import handlers  # noqa: F401  (registers the handlers)
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.install.rbac import RULES
from kubeinfer.operator.spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

NAMESPACE = "default"
ISVC_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
GROUP_PATH = f"/apis/{GROUP}/{VERSION}"
TEST_USER_AGENT = "kubeinfer-tests"
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"


def serve_cluster(kmock: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                  extra_resources: dict[str, Any] | None = None) -> Any:
    """kmock serving the built-in resources, our CRD and `extra_resources`, with a kubeconfig pointing at it."""
    kmock.resources.load_bundled()
    kmock.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock_lib.ResourceInfo(
        kind=KIND, singular=SINGULAR, shortnames=set(SHORT_NAMES), namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"}, subresources={"status", "scale"})
    for path, info in (extra_resources or {}).items():
        kmock.resources[path] = info
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": NAMESPACE}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return kmock


def write_requests(server: Any, start: int = 0) -> list[Any]:
    """Requests that could change state, in order, recorded since index ``start``."""
    return [r for r in list(server)[start:] if r.method is not None and r.method.value in WRITE_METHODS]


def kopf_rewrote_its_record(request: Any, obj: dict[str, Any]) -> bool:
    """Whether `request` is kopf storing again, unchanged, the record of the spec it handled (`obj`'s annotation).

    kmock keeps no resourceVersion, so kopf cannot tell an event queued before its own record patch (our status
    write's echo) from one after it: it handles the stale one as a creation again (our handler finds nothing to
    change) and stores the same record. On a real API server the versions make kopf wait for its own patch's event.
    """
    key = f"{GROUP}/last-handled-configuration"
    record = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return (record is not None and request.method is not None and request.method.value == "PATCH"
            and request.data == {"metadata": {"annotations": {f"{GROUP}/kopf-managed": "yes", key: record}}})


def operator_requests(server: Any) -> list[Any]:
    """Requests made by the operator (kopf or the applier), not by the test's own client."""
    return [r for r in list(server) if r.headers.get("User-Agent") != TEST_USER_AGENT]


def _verb(request: Any) -> str:
    if request.params.get("watch") == "true":
        return "watch"
    return {"GET": "get" if request.name else "list", "POST": "create", "PATCH": "patch", "PUT": "update",
            "DELETE": "delete"}[request.method.value]


def permissions_used(server: Any) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], verb) of every request the operator made (discovery, /api and /apis,
    is open to every authenticated client: skipped)."""
    used = set()
    for r in operator_requests(server):
        if r.resource is None or r.resource.plural is None:
            continue
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        used.add((r.resource.group, resource, _verb(r)))
    return used


def rbac_checked_requests(server: Any) -> set[tuple[str, str, str]]:
    """`permissions_used`, each asserted to be allowed by the ClusterRole's rules."""
    used = permissions_used(server)
    for key in used:
        assert any(key[0] in rule["apiGroups"] and key[1] in rule["resources"] and key[2] in rule["verbs"]
                   for rule in RULES), f"RBAC does not allow {key}"
    return used


async def settle(server: Any, quiet: float = 0.4, timeout: float = 60.0,
                 requests: Callable[[Any], list[Any]] = list) -> None:
    """Wait until the operator has made no request (of those `requests(server)` lists) for a quiet window: ``quiet``
    seconds, or four times the longest pause it made between two requests while it was still working, whichever is
    longer (at most 10 s). On a loaded machine a reconcile's requests are spaced out, and a pause inside one pass
    must not pass for the end of its work. ``timeout`` bounds an operator that never stops making requests."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen, last_change, longest_pause, started = len(requests(server)), loop.time(), 0.0, False
    while loop.time() < deadline:
        await asyncio.sleep(0.05)
        now, count = loop.time(), len(requests(server))
        if count != seen:
            if started:   # the wait before the first new request is the operator's reaction, not a pause
                longest_pause = max(longest_pause, now - last_change)
            seen, last_change, started = count, now, True
        elif now - last_change >= min(10.0, max(quiet, 4 * longest_pause)):
            return
    raise AssertionError(f"the operator never went quiet: {[(r.method, str(r.url)) for r in requests(server)[-8:]]}")


async def wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _watching(server: Any, plural: str) -> bool:
    return any(r.params.get("watch") == "true" and f"/{plural}" in str(r.url) for r in list(server))


@contextlib.asynccontextmanager
async def operator_with_periodic_pass(server: Any, isvc: str, seconds: float = 0.3) -> AsyncIterator[Any]:
    """The operator with its periodic pass (adapters, model pools) every `seconds`; on exit the InferenceService `isvc`
    is deleted while it runs, so that kopf stops that pass's daemon and drops its finalizer (else stopping the
    operator waits on the daemon)."""
    config = OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True, service_monitor="never",
                            adapter_sync_seconds=seconds)
    async with running_operator(server, config):
        yield server
        kapi = KApi(str(server.url))
        await kapi.call("DELETE", isvc)
        await kapi.gone(isvc, "the finalizer was never removed")


@contextlib.asynccontextmanager
async def running_operator(server: Any, config: OperatorConfig | None = None) -> AsyncIterator[None]:
    """Run the real operator (all handlers of kubeinfer.operator.handlers) until the block exits.

    It runs in its own thread and event loop: on exit kopf cancels every task of its loop that it did
    not find at start, which would include the test's own tasks if they shared a loop.
    """
    config = config or OperatorConfig(scanning=False, namespaces=(NAMESPACE,), standalone=True,
                                      service_monitor="never")
    stop = threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        settings = kopf.OperatorSettings()
        settings.networking.error_backoffs = [0.1]
        try:
            asyncio.run(kopf.operator(
                registry=kopf.get_default_registry(), settings=settings, memo=kopf.Memo(config=config),
                standalone=True, namespaces=list(config.namespaces), stop_flag=stop))
        except BaseException as e:  # reported to the test below
            errors.append(e)

    thread = threading.Thread(target=main, name="kopf-operator", daemon=True)
    thread.start()
    try:
        # Objects created before kopf's watch arrives would be replayed as ADDED and handled twice.
        for plural in (PLURAL, "deployments", "services", "poddisruptionbudgets", "pods"):
            await wait_for(lambda: errors or not thread.is_alive() or _watching(server, plural),
                           what=f"watch on {plural}")
        if errors:
            raise errors[0]
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"


def isvc_path(namespace: str, name: str | None = None) -> str:
    return f"{GROUP_PATH}/namespaces/{namespace}/inferenceservices" + (f"/{name}" if name else "")


def child_path(kind: str, namespace: str, name: str) -> str:
    base = {"Deployment": "/apis/apps/v1", "Service": "/api/v1", "PodDisruptionBudget": "/apis/policy/v1",
            "ServiceMonitor": "/apis/monitoring.coreos.com/v1", "Pod": "/api/v1"}[kind]
    plural = {"Deployment": "deployments", "Service": "services", "PodDisruptionBudget": "poddisruptionbudgets",
              "ServiceMonitor": "servicemonitors", "Pod": "pods"}[kind]
    return f"{base}/namespaces/{namespace}/{plural}/{name}"


class KApi:
    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json",
                   "User-Agent": TEST_USER_AGENT}
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.base + path, json=body, headers=headers) as resp:
                data = await resp.json(content_type=None) if resp.content_length != 0 else None
                return resp.status, data

    async def get(self, path: str) -> dict[str, Any] | None:
        status, data = await self.call("GET", path)
        return data if status == 200 else None

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, data = await self.call("POST", path, body)
        assert status in (200, 201), (status, data)
        return data

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, data = await self.call("PATCH", path, body)
        assert status == 200, (status, data)
        return data

    async def delete(self, path: str) -> None:
        status, data = await self.call("DELETE", path)
        assert status == 200, (status, data)

    async def eventually(self, path: str, check: Any, timeout: float = 30.0) -> dict[str, Any]:
        """Poll ``path`` until ``check(obj)`` is true; returns the object. ``timeout`` only bounds a state that never
        comes: a passing test waits for the operator alone (on a busy 2-core box one of its passes took over 5 s)."""
        deadline = asyncio.get_running_loop().time() + timeout
        last = None
        while asyncio.get_running_loop().time() < deadline:
            last = await self.get(path)
            if last is not None and check(last):
                return last
            await asyncio.sleep(0.05)
        raise AssertionError(f"{path} never satisfied the check; last seen: {last}")

    async def gone(self, path: str, what: str = "", timeout: float = 30.0) -> None:
        """Poll ``path`` until it no longer exists (a deletion kopf finishes by removing its finalizer once it has
        stopped the object's daemons, up to their 1 s backoff and 10 s cancellation timeout; garbage collection).
        ``timeout`` only bounds a deletion that never ends, as in `eventually`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while await self.get(path) is not None:
            assert asyncio.get_running_loop().time() < deadline, what or f"{path} was never deleted"
            await asyncio.sleep(0.05)


async def events(kapi: Any, reason: str | None = None) -> list[dict[str, Any]]:
    items = (await kapi.get(EVENTS) or {}).get("items") or []
    return [e for e in items if e.get("source", {}).get("component") == "kubeinfer-operator"
            and (reason is None or e["reason"] == reason)]


async def eventually_events(kapi: Any, reason: str, check: Any = bool, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The operator's Events of `reason`, once `check` holds for them (by default: once there are any). An Event is
    posted after the write it reports, so a test that saw the write must wait for it; `timeout` only bounds an Event
    that never comes, as kapi.eventually (5 s was not enough for the autoscaler's first passes at load 10-20)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await events(kapi, reason)
        if found and check(found):
            return found
        assert asyncio.get_running_loop().time() < deadline, f"no such {reason} Event: {found}"
        await asyncio.sleep(0.05)
