"""A counting proxy in front of the Kubernetes API server, for one client (the operator under test).

The client talks plain HTTP to 127.0.0.1:PORT (a kubeconfig without credentials, `kubeconfig_for`); the proxy
forwards every request to the real API server over TLS with the credentials of the given kubeconfig, streams
the answers (watches included), and records each request's method and path. `cut_watches()` ends every open
watch stream, as an API server does when a watch times out: the client re-lists and watches again, which is
the operator's full resync.
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass

import aiohttp
import yaml
from aiohttp import web
from kubernetes import config as kube_config
from kubernetes.client import Configuration

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOP_HEADERS = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length",
                         "authorization", "accept-encoding"})


@dataclass(frozen=True)
class Request:
    time: float   # time.monotonic() when it arrived
    method: str
    path: str
    query: str

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    @property
    def is_watch(self) -> bool:
        return "watch=true" in self.query


class ApiCounter:
    """The proxy, on its own event loop in a thread; `requests` grows as the client talks."""

    def __init__(self, kubeconfig: str, port: int) -> None:
        upstream = Configuration()
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=upstream)
        self.upstream = upstream.host
        self.ssl = ssl.create_default_context(cafile=upstream.ssl_ca_cert)
        if upstream.cert_file:
            self.ssl.load_cert_chain(upstream.cert_file, upstream.key_file)
        self.token = upstream.get_api_key_with_prefix("BearerToken") or ""
        self.port = port
        self.requests: list[Request] = []   # in order of arrival
        self.last_active = 0.0   # time.monotonic() of the last start or end of a request that is not a watch
        self.in_flight = 0   # requests (not watches) started and not yet answered in full
        self._watches: set[aiohttp.ClientResponse] = set()   # upstream answers of open watches
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the counting proxy did not start on port {port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def since(self, start: float) -> list[Request]:
        requests = self.requests[:]
        return requests[bisect.bisect_left(requests, start, key=lambda r: r.time):]

    def cut_watches(self) -> int:
        """End every open watch stream; returns how many were open."""
        future = asyncio.run_coroutine_threadsafe(self._cut(), self._loop)
        return future.result(10)

    async def _cut(self) -> int:
        watches = list(self._watches)
        for upstream in watches:
            upstream.close()   # the forwarding loop then ends the client's stream cleanly
        return len(watches)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._session = self._loop.run_until_complete(self._open_session())
        self._ready.set()
        self._loop.run_forever()

    async def _open_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, limit=200),
                                     timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        record = Request(time.monotonic(), request.method, request.path, request.query_string)
        self.requests.append(record)
        if record.is_watch:
            return await self._relay(request, record)
        self.last_active, self.in_flight = record.time, self.in_flight + 1
        try:
            return await self._relay(request, record)
        finally:   # an answer the API server takes seconds to give is not idleness
            self.last_active, self.in_flight = time.monotonic(), self.in_flight - 1

    async def _relay(self, request: web.Request, record: Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = await request.read()
        url = self.upstream + request.rel_url.raw_path_qs
        async with self._session.request(request.method, url, headers=headers, data=body or None) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await response.prepare(request)
            if record.is_watch:
                self._watches.add(upstream)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except aiohttp.ClientError:
                pass   # cut by cut_watches()
            finally:
                self._watches.discard(upstream)
            try:
                await response.write_eof()
            except ConnectionError:
                pass   # the client went first
            return response


def kubeconfig_for(url: str) -> str:
    """A kubeconfig file pointing at the proxy, without credentials (the proxy adds them)."""
    document = {"apiVersion": "v1", "kind": "Config", "current-context": "proxy",
                "clusters": [{"name": "proxy", "cluster": {"server": url}}],
                "users": [{"name": "proxy", "user": {}}],
                "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}]}
    handle = tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False)
    yaml.safe_dump(document, handle)
    handle.close()
    return handle.name


def resource_of(path: str) -> str:
    """`/apis/G/V/namespaces/NS/PLURAL/NAME/SUB` -> `PLURAL/SUB`, `PLURAL` for a collection or object."""
    parts = path.strip("/").split("/")
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        parts = parts[parts.index("namespaces") + 2:]
    else:
        parts = parts[2:] if parts[0] == "apis" else parts[1:]
    return "/".join(parts[:1] + parts[2:3])


def count_by_verb(requests: list[Request]) -> collections.Counter[str]:
    return collections.Counter("WATCH" if r.is_watch else r.method for r in requests)
