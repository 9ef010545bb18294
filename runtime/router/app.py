"""The router's ASGI application: OpenAI routes proxied, `/v1/models`, health, readiness and metrics.

A plain ASGI callable rather than a framework: the router adds as little as it can to every request, and
it needs the raw receive/send pair anyway to pass streams through and see clients leave.
"""
import asyncio
import contextlib
import json
import logging
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kubeinfer.runtime.router.adapters import Adapters, LoadFailed
from kubeinfer.runtime.router.discovery import EndpointSliceWatch, EndpointsFileWatch
from kubeinfer.runtime.router.disagg import PATHS as DISAGGREGATION_PATHS, PrefillPool
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.policies import Chooser
from kubeinfer.runtime.router.pool_routes import PoolRoutes
from kubeinfer.runtime.router.proxy import Proxy, UpstreamFailed
from kubeinfer.runtime.router.relayed import REPLICA_HEADER
from kubeinfer.runtime.router.replicas import ReplicaSet
from kubeinfer.runtime.router.settings import RouterSettings
from kubeinfer.runtime.router import route_trace
from kubeinfer.runtime.router.tenants import TenantGate
from kubeinfer.runtime.server.trusted_header import TrustedTenantHeader
from kubeinfer.runtime.router.waiting_room import Refused, WaitingRoom
from kubeinfer.runtime.server.errors import error_body

logger = logging.getLogger(__name__)
# /v1/responses with `previous_response_id` goes to the replica that answered the earlier response (proxy.py,
# response_owners.py); GET/DELETE /v1/responses/{id} are not proxied.
PROXIED = {"/v1/completions", "/v1/chat/completions", "/v1/responses"}


async def respond(send, status: int, body: bytes, content_type: bytes = b"application/json",
                  extra: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send, status: int, message: str, code: str | None = None,
                        retry_after: float | None = None, param: str | None = None) -> None:
    extra = [(b"retry-after", str(max(1, round(retry_after))).encode())] if retry_after is not None else []
    await respond(send, status, json.dumps(error_body(status, message, param, code)).encode(), extra=extra)


class Router:
    def __init__(self, settings: RouterSettings):
        self.settings = settings
        self.metrics = RouterMetrics()
        # A model pool: one route per model (pool_routes.py), which stands for the replica set here
        self.pool = PoolRoutes(settings, self.metrics) if settings.pool_models else None
        self.replicas = self.pool or ReplicaSet(settings.upstreams, settings.scrape_interval, settings.stale_after,
                                                settings.connect_timeout)
        self.room = WaitingRoom(self.replicas, settings.max_queued_requests, settings.max_queued_bytes,
                                settings.queue_timeout)
        self.adapters = Adapters(settings, self.replicas, self.metrics)
        self.prefill = PrefillPool(settings, self.metrics) if settings.disaggregated else None
        self.proxy = self.pool or Proxy(self.replicas, Chooser(settings), self.room, self.metrics,
                                        settings.queue_timeout, self.adapters, self.prefill)
        if self.prefill is not None:
            for path in DISAGGREGATION_PATHS:
                self.metrics.disaggregated.labels(path)
        self.tenants = TenantGate(settings.api_keys_file, settings.max_in_flight_per_tenant,
                                  TrustedTenantHeader(settings.trusted_tenant_header, settings.trusted_tenant_networks))
        self._tasks: list[asyncio.Task] = []
        self._watches: list[EndpointSliceWatch] = []

    async def start(self) -> None:
        settings = self.settings
        self._discover(self.replicas, settings.service, settings.endpoints_file)
        if self.prefill is not None:
            self._discover(self.prefill.replicas, settings.prefill_service, settings.prefill_endpoints_file)

    def _discover(self, replicas: ReplicaSet, service: str | None, endpoints_file: str | None) -> None:
        """Scrapes `replicas`, and follows a Service's ready endpoints or an endpoints file if given."""
        self._tasks.append(asyncio.ensure_future(replicas.scrape_forever()))
        if service is not None:
            loop = asyncio.get_running_loop()
            watch = EndpointSliceWatch(self.settings.namespace, service, self.settings.service_port_name,
                                       lambda urls: loop.call_soon_threadsafe(replicas.set_urls, urls))
            watch.start()
            self._watches.append(watch)
        if endpoints_file is not None:
            self._tasks.append(asyncio.ensure_future(EndpointsFileWatch(endpoints_file, replicas.set_urls).run()))

    async def stop(self) -> None:
        for watch in self._watches:
            watch.stop()
        for task in (*self._tasks, self.room.releasing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.replicas.close()
        if self.prefill is not None:
            self.prefill.replicas.close()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in PROXIED and method == "POST":
            return await self._proxy(scope, receive, send)
        if method != "GET":
            return await respond_error(send, 405 if path in PROXIED else 404, f"{method} {path} is not served here")
        if path == "/health" or (path == "/ready" and self.replicas.known):
            return await respond(send, 200, b'{"status":"ok"}')
        if path == "/ready":   # discovery has not said yet which replicas there are
            return await respond(send, 503, b'{"status":"waiting for the list of replicas"}')
        if path == "/metrics":
            return await respond(send, 200, self._metrics_text(), CONTENT_TYPE_LATEST.encode())
        if path == "/v1/models":
            return await respond(send, 200, json.dumps(self._models()).encode())
        await respond_error(send, 404, f"{path} is not served here")

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _proxy(self, scope, receive, send) -> None:
        received_at = time.perf_counter()
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.settings.max_body_bytes:
                return await respond_error(send, 413, f"the request body is over {self.settings.max_body_bytes} bytes")
            if not message.get("more_body"):
                break
        # The client may leave while the replica works: a watcher cancels this task then, which closes the
        # upstream request, which aborts it on the replica. (One extra task, not two: this is per request.)
        this_task, left = asyncio.current_task(), asyncio.Event()

        async def watch() -> None:
            await _wait_for_disconnect(receive)
            left.set()
            this_task.cancel()
        watcher = asyncio.ensure_future(watch())
        try:
            await self._forward(scope, bytes(body), send, received_at)
        except asyncio.CancelledError:
            if not left.is_set():
                raise
        finally:
            watcher.cancel()

    async def _forward(self, scope, body: bytes, send, received_at: float) -> None:
        trace = route_trace.begin(scope)
        admission_started = time.time_ns()
        peer = (scope.get("client") or (None,))[0]
        tenant = self.tenants.tenant(scope["headers"], peer)
        scope = dict(scope, headers=self.tenants.forwarded(scope["headers"], peer))
        try:
            self.tenants.enter(tenant.name)
        except Refused as refused:
            self.metrics.refused.labels(str(refused.status)).inc()
            trace.end(refused.status, refused.message)
            return await respond_error(send, refused.status, refused.message, refused.code, refused.retry_after)
        trace.admitted(tenant.name, admission_started)
        started = False   # whether the client has the response's start (an error answer is then too late)
        status, error_text = None, "cancelled: the client went away"   # the trace's ending, unless set below

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.proxy.forward(scope, body, tracked, received_at, tenant, trace)
            error_text = None
        except Refused as refused:
            self.metrics.refused.labels(str(refused.status)).inc()
            status, error_text = refused.status, refused.message
            await respond_error(send, refused.status, refused.message, refused.code, refused.retry_after,
                                refused.param)
        except LoadFailed as failed:   # the replica's own answer to loading the adapter, as it wrote it
            status, error_text = failed.status, "the adapter could not be loaded"
            await respond(send, failed.status, failed.body, failed.content_type,
                          [(REPLICA_HEADER.encode(), failed.replica_url.encode())])
        except UpstreamFailed as failed:
            self.metrics.refused.labels("502").inc()
            status, error_text = 502, str(failed)
            await respond_error(send, 502, str(failed), "replica_failed")
        except Exception as error:   # a bug: its traceback in the log, and an OpenAI error body, not a bare 500
            logger.exception("routing %s %s failed", scope.get("method"), scope["path"])
            status, error_text = 500, f"{type(error).__name__}: {error}"
            if started:
                raise
            self.metrics.refused.labels("500").inc()
            await respond_error(send, 500, f"the router failed: {type(error).__name__}: {error}", "router_error")
        finally:
            self.tenants.leave(tenant.name)
            trace.end(status, error_text)

    def _models(self) -> dict:
        """The base model, then each adapter with its parent, as a replica lists them (docs/lora.md)."""
        name = self.settings.served_model_name or self.replicas.model_name
        created = int(time.time())
        if self.pool is not None:
            return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                                "owned_by": "kubeinfer"} for model in self.pool.models]}
        data = [] if name is None else [{"id": name, "object": "model", "created": created, "owned_by": "kubeinfer"}]
        for adapter in self.adapters.names():
            data.append({"id": adapter, "object": "model", "created": created, "owned_by": "kubeinfer",
                         "root": self.adapters.offered.get(adapter), "parent": name})
        return {"object": "list", "data": data}

    def _metrics_text(self) -> bytes:
        m = self.metrics
        m.queue_requests.set(self.room.num_waiting)
        m.queue_bytes.set(self.room.num_bytes)
        m.replicas_up.set(len(self.replicas.available()))
        if self.prefill is not None:
            m.prefill_up.set(len(self.prefill.available()))
        for replica in self.replicas.replicas.values():
            m.in_flight.labels(replica.url).set(replica.in_flight)
        m.lora_load_waiting.set(self.adapters.num_waiting)
        for adapter in self.adapters.names():
            m.lora_replicas.labels(adapter).set(len(self.adapters.holders(adapter)))
        if self.pool is not None:
            self.pool.update_metrics()
        return generate_latest(m.registry)


async def _wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
