"""Replicas from Kubernetes, two ways; either hands the router the set of ready replica URLs on each change.

- `EndpointSliceWatch` (`--service`): the ready endpoints of one Service, from its EndpointSlices, watched
  through the API server. Kubernetes already knows which pods are ready (their readiness probes): the router
  takes those, and only those. The watch runs on a thread with the official client (it is synchronous).
- `EndpointsFileWatch` (`--endpoints-file`): a file holding a JSON list of URLs, read every `interval`
  seconds. The operator's router pods get it from a downward API volume of one of their own annotations,
  which the operator keeps equal to the InferenceService's ready replicas: the router then needs no access
  to the API server (no token, no RBAC), and works where pods cannot reach it (docs/router.md).

The router still scrapes every replica before picking it.
"""
import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"   # set by the EndpointSlice controller on a Service's slices
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def ready_urls(slices: Iterable[dict], port_name: str) -> set[str]:
    """`http://ADDRESS:PORT` of every ready endpoint of the slices, on the port named `port_name`.

    An endpoint whose `ready` condition is unset counts as ready (the API's convention for unknown)."""
    urls = set()
    for piece in slices:
        port = next((p.get("port") for p in piece.get("ports") or () if p.get("name") == port_name), None)
        if port is None:
            continue
        ipv6 = piece.get("addressType") == "IPv6"
        for endpoint in piece.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or ():
                urls.add(f"http://[{address}]:{port}" if ipv6 else f"http://{address}:{port}")
    return urls


def default_namespace() -> str:
    """The pod's own namespace when in a cluster, else `default`."""
    try:
        with open(NAMESPACE_FILE) as file:
            return file.read().strip() or "default"
    except OSError:
        return "default"


class EndpointSliceWatch:
    """Lists, then watches, the Service's EndpointSlices; calls `on_change(urls)` whenever the set changes."""

    def __init__(self, namespace: str, service: str, port_name: str, on_change: Callable[[set[str]], None]):
        self.namespace, self.service, self.port_name = namespace, service, port_name
        self.on_change = on_change
        self._slices: dict[str, dict] = {}
        self._last: set[str] | None = None
        self._stopped = threading.Event()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        import kubernetes
        from kubeinfer.operator.kube import load_configuration

        client = kubernetes.client.ApiClient(load_configuration())
        api = kubernetes.client.DiscoveryV1Api(client)
        selector = f"{SERVICE_NAME_LABEL}={self.service}"
        while not self._stopped.is_set():
            try:
                listing = api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                self._slices = {s.metadata.name: client.sanitize_for_serialization(s) for s in listing.items}
                self._publish()
                watch = kubernetes.watch.Watch()
                for event in watch.stream(api.list_namespaced_endpoint_slice, self.namespace,
                                          label_selector=selector, resource_version=listing.metadata.resource_version,
                                          timeout_seconds=300):
                    if self._stopped.is_set():
                        watch.stop()
                        return
                    self._apply(event["type"], client.sanitize_for_serialization(event["object"]))
            except Exception as error:   # noqa: BLE001 - any failure: log one line, list again shortly
                logger.warning("watching the EndpointSlices of %s/%s failed (%s: %s); retrying in 1 s",
                               self.namespace, self.service, type(error).__name__, error)
                time.sleep(1)

    def _apply(self, kind: str, piece: dict) -> None:
        name = (piece.get("metadata") or {}).get("name")
        if kind == "DELETED":
            self._slices.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._slices[name] = piece
        self._publish()

    def _publish(self) -> None:
        urls = ready_urls(self._slices.values(), self.port_name)
        if urls != self._last:
            self._last = urls
            logger.info("service %s/%s: %d ready endpoints", self.namespace, self.service, len(urls))
            self.on_change(urls)


def parse_endpoints(text: str) -> set[str] | None:
    """The URLs of an endpoints file: a JSON list of `http://HOST:PORT`. None while the file is empty (its
    annotation is not written yet: unknown, which is not the same as an empty list, no replica). Raises
    ValueError on anything else."""
    text = text.strip()
    if not text:
        return None
    urls = json.loads(text)
    if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
        raise ValueError("expected a JSON list of URLs")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port or parts.path not in ("", "/"):
            raise ValueError(f"{url!r} is not http://HOST:PORT")
    return {url.rstrip("/") for url in urls}


class EndpointsFileWatch:
    """Reads `path` every `interval` seconds; calls `on_change(urls)` when the list in it changes."""

    def __init__(self, path: str, on_change: Callable[[set[str]], None], interval: float = 0.2):
        self.path, self.on_change, self.interval = path, on_change, interval
        self._text: str | None = None

    def poll(self) -> None:
        """One read (a few hundred bytes on a memory-backed volume: cheap enough for the event loop)."""
        try:
            with open(self.path) as file:
                text = file.read()
        except OSError as error:
            text = f"unreadable: {error}"
        if text == self._text:
            return
        self._text = text
        try:
            urls = parse_endpoints(text)
        except ValueError as error:   # includes JSON errors; the last good list stays
            logger.warning("endpoints file %s: %s; keeping the last list", self.path, error)
            return
        if urls is not None:
            logger.info("endpoints file %s: %d ready replicas", self.path, len(urls))
            self.on_change(urls)

    async def run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.interval)
