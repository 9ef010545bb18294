"""Forwarding one request: wait for a replica, pick one, relay its answer byte for byte.

- A connection refused (or any failure or timeout to connect) never reached a replica: that replica is marked down and
  the request goes to another (or waits for one), within the request's deadline.
- A replica that answers 503 `draining` (shutting down; the request never reached its engine) is treated the
  same way, and left out of the pick for `DRAINING_HOLD_SECONDS`.
- A replica that fails after the request reached it, before its answer started (it died, or it answers 503
  `engine_dead`: its engine died), is marked down and the request goes to another, at most `MAX_RESUMES` times: the
  client got nothing yet.
- A replica that dies mid-stream: a resumable stream (`resume.py`: one choice, completions or chat, no tools) goes
  on on another replica from where the client's stream stopped, under the same id, at most `MAX_RESUMES` times;
  so does one whose replica says its engine died (`resume.failed_event`).
  Any other stream, or one that finds no replica within the queue timeout, ends with an OpenAI-style error event,
  as the runtime's own streams end when its engine dies; a response that is not a stream ends cut.
- A request for a LoRA adapter goes to a replica that has it loaded, after having it loaded on one if none has
  (`adapters.py`). A replica that answers such a request 404 `model_not_found` has dropped the adapter (its
  `--max-cpu-loras` LRU, an unload) since its last scrape: the adapter is struck off it and the request placed
  again, at most `MAX_NOT_LOADED` times (then the 404 goes to the client).
- Disaggregated serving (`disagg.py`, with a prefill pool): the first attempt of a request the KV transfer supports
  goes to a decode replica naming a prefill replica's KV endpoint; a failed transfer falls back to colocated, and the
  retries and resumes above are colocated.
- The caller cancels `forward` when the client goes away; closing the upstream connection then makes the replica
  abort the request and free its KV blocks. Each step is in the request's trace (route_trace.py) when tracing is on.
"""
import json
import logging
import time

from kubeinfer.runtime.router.adapters import Adapters, LoadFailed, LoadUnreachable
from kubeinfer.runtime.router.affinity import cache_scope, prompt_text
from kubeinfer.runtime.router.relayed import request_headers, response_headers, sse_error
from kubeinfer.runtime.router.disagg import PrefillPool, decoders, pick_decode, strip_source
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.policies import Chooser
from kubeinfer.runtime.router.pool import Pool
from kubeinfer.runtime.router.replicas import Replica, ReplicaSet
from kubeinfer.runtime.router.route_trace import UNTRACED, RouteTrace
from kubeinfer.runtime.router.resume import MAX_RESUMES, RESUMABLE_HEADER, StreamProgress, is_resumable
from kubeinfer.runtime.router.response_owners import ResponseOwners
from kubeinfer.runtime.router.upstream import ConnectFailed, Response, UpstreamError
from kubeinfer.runtime.router.waiting_room import Refused, WaitingRoom
from kubeinfer.runtime.server.auth import ANONYMOUS, Tenant

logger = logging.getLogger(__name__)
DRAINING_HOLD_SECONDS = 5.0
FAILED_HOLD_SECONDS = 5.0   # a replica that failed a request stays out of the pick this long, even if it scrapes
MAX_NOT_LOADED = 2          # placements again of a request whose replica had dropped its adapter
RESPONSES_PATH = "/v1/responses"


class EngineDied(UpstreamError):
    """The replica said, in a stream, that its engine died (`resume.failed_event`)."""


class UpstreamFailed(Exception):
    """The replica failed after the request reached it, before its response started."""


class Proxy:
    def __init__(self, replicas: ReplicaSet, chooser: Chooser, room: WaitingRoom, metrics: RouterMetrics,
                 queue_timeout: float, adapters: Adapters, prefill: PrefillPool | None = None, pool: Pool | None = None):
        self.replicas, self.chooser, self.room, self.metrics = replicas, chooser, room, metrics
        self.prefill, self.adapters, self.queue_timeout, self.pool = prefill, adapters, queue_timeout, pool
        self.response_owners = ResponseOwners()

    async def forward(self, scope: dict, body: bytes, send, received_at: float, tenant: Tenant = ANONYMOUS,
                      trace: RouteTrace = UNTRACED) -> None:
        """Sends the request to a replica and relays the response to `send`, resuming it elsewhere if the replica
        dies. Raises `Refused`/`UpstreamFailed`/`LoadFailed` before anything was sent to the client. `tenant`: its
        place in the waiting room's order; `trace`: its spans (route_trace.py)."""
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None   # the replica answers bad JSON with its own 400
        body, parsed = strip_source(body, parsed)
        text = prompt_text(parsed) if isinstance(parsed, dict) else ""
        adapter = self.adapters.resolve(parsed.get("model")) if isinstance(parsed, dict) else None
        headers = request_headers(scope)
        progress = None
        if is_resumable(scope["path"], parsed):
            progress = StreamProgress()
            headers.append((RESUMABLE_HEADER, b"1"))
        started = False   # the client has the response's start
        for attempt in range(MAX_RESUMES + 1):
            try:
                opened = None
                if attempt == 0 and self.prefill is not None:
                    opened = await self.prefill.open(self, scope["path"], headers, parsed, text, adapter, received_at,
                                                     tenant, trace)
                    received_at = None   # observed by that attempt
                if opened is None:
                    opened = await self._open(scope["path"], headers, body, parsed, text, adapter,
                                              received_at if attempt == 0 else None, tenant, trace=trace)
                replica, response, prefetched = opened
            except UpstreamFailed as failed:
                if attempt == MAX_RESUMES:
                    if not started:
                        raise
                    return await self._end_with_error(send, str(failed))
                self.metrics.resumes.labels("retried" if not started else "resumed").inc()
                continue
            except (Refused, LoadFailed) as refused:   # no replica came up in time, or none could load the adapter
                if not started:
                    raise
                return await self._end_with_error(send, f"no replica could resume the stream: {refused}")
            if started and response.status != 200:   # the continuation was refused: say why, in the stream
                answer = (prefetched if prefetched is not None else await response.read()).decode(errors="replace")
                replica.in_flight -= 1
                response.release()
                return await self._end_with_error(send, f"the stream could not be resumed: {answer[:500]}")
            learn = self.response_owners.learn if scope["path"] == RESPONSES_PATH and response.status == 200 else None
            failed = await self._relay(response, replica, send, prefetched, learn, progress, started)
            trace.attempt_ended(None if failed is None else f"failed mid-response: {failed}")
            started = True
            if failed is None:
                return
            self.replicas.mark_down(replica, f"failed mid-response: {failed}", FAILED_HOLD_SECONDS)
            self.chooser.forget(replica)
            if progress is None or not progress.resumable or attempt == MAX_RESUMES:
                if (response.header(b"content-type") or b"").startswith(b"text/event-stream"):
                    return await self._end_with_error(send, f"the replica serving this request failed: {failed}")
                return await send({"type": "http.response.body", "body": b"", "more_body": False})
            logger.info("resuming a stream of replica %s after %d tokens", replica.url, len(progress.token_ids))
            self.metrics.resumes.labels("resumed").inc()
            body, progress.failed = progress.resume_body(parsed), None   # a fresh attempt

    async def _open(self, path: str, headers: list, body: bytes, parsed, text: str, adapter: str | None,
                    received_at: float | None, tenant: Tenant = ANONYMOUS, decode: bool = False,
                    trace: RouteTrace = UNTRACED):
        """(replica, response, prefetched body) once a replica answered: connect failures and draining replicas
        are tried again elsewhere within the queue timeout; a replica that fails before answering is marked down
        and raises `UpstreamFailed`. `adapter`: the LoRA adapter the request names, loaded first where none is.
        `received_at`: when the client's request came (None for a later attempt). `decode`: a disaggregated request,
        for the decode replica by load and KV headroom (`disagg.pick_decode`)."""
        deadline = time.monotonic() + self.queue_timeout
        waited = loading = 0.0
        not_loaded = 0   # replicas that turned out to have dropped the adapter
        while True:
            trace.picking()
            waited += await self.room.wait_until_up(len(body), deadline, tenant)
            if adapter is not None and not self.adapters.holders(adapter):
                started = time.monotonic()
                try:
                    await self.adapters.place(adapter, headers, deadline)
                except LoadUnreachable as unreachable:
                    self._unreachable(unreachable, deadline, f"no replica could load adapter {adapter!r}")
                loading += time.monotonic() - started
                continue   # look again: the replica that loaded it may have gone down meanwhile
            replica, reason = (pick_decode(decoders(self.replicas.available()) or self.replicas.available(),
                                           self.chooser.settings.weights, self.chooser.settings.stale_after)
                               if decode else self._choose(path, parsed, text, adapter, tenant))
            if received_at is not None:
                self.metrics.added.observe(time.perf_counter() - received_at - waited - loading)
            if self.pool is None:
                replica.in_flight += 1
            else:   # counted there once its model is awake
                try:
                    loading += await self.pool.admit(replica, headers, deadline)
                except LoadUnreachable as unreachable:
                    self._unreachable(unreachable, deadline, f"no pod could wake model {replica.model_name!r}")
                    continue
            sent = trace.sending(headers, replica.url, reason, waited, loading)
            try:
                response = await replica.upstream.request("POST", path, sent, body)
            except ConnectFailed as error:   # never reached it
                replica.in_flight -= 1
                trace.attempt_ended(f"connect failed: {error}")
                self.metrics.upstream_errors.labels("timeout" if error.timed_out else "connect").inc()
                self.replicas.mark_down(replica, f"connect failed: {error}")
                self.chooser.forget(replica)   # a replica that comes back after this has an empty cache
                if time.monotonic() >= deadline:
                    raise Refused(503, "no replica could be reached; retry later", "no_replica",
                                  self.queue_timeout) from None
                continue
            except UpstreamError as error:
                replica.in_flight -= 1
                trace.attempt_ended(f"failed before answering: {error}")
                self.metrics.upstream_errors.labels("disconnect").inc()
                self.replicas.mark_down(replica, f"failed before answering: {error}", FAILED_HOLD_SECONDS)
                self.chooser.forget(replica)
                raise UpstreamFailed(f"replica {replica.url} failed: {error}") from None
            except BaseException:   # cancelled (the client left) while waiting for the response to start
                replica.in_flight -= 1
                raise
            prefetched = None
            # small JSON errors: read them to tell draining, or a dropped adapter, from other refusals
            if response.status == 503 or (response.status == 404 and adapter is not None):
                try:
                    prefetched = await response.read()
                except BaseException as error:   # failed or cancelled while reading it
                    replica.in_flight -= 1
                    response.close()
                    if isinstance(error, UpstreamError):
                        raise UpstreamFailed(f"replica {replica.url} failed: {error}") from None
                    raise
                if response.status == 503 and b'"engine_dead"' in prefetched:   # it never answered: elsewhere
                    replica.in_flight -= 1
                    response.release()
                    self.metrics.upstream_errors.labels("engine_dead").inc()
                    self.replicas.mark_down(replica, "its engine died", FAILED_HOLD_SECONDS)
                    self.chooser.forget(replica)
                    raise UpstreamFailed(f"replica {replica.url}: its engine died")
                if response.status == 503 and b'"draining"' in prefetched:
                    replica.in_flight -= 1
                    response.release()
                    self.metrics.upstream_errors.labels("draining").inc()
                    self.replicas.mark_down(replica, "draining", DRAINING_HOLD_SECONDS)
                    if time.monotonic() >= deadline:
                        raise Refused(503, "no replica could take the request; retry later", "no_replica",
                                      self.queue_timeout)
                    continue
                if response.status == 404 and b'"model_not_found"' in prefetched and not_loaded < MAX_NOT_LOADED:
                    not_loaded += 1
                    replica.in_flight -= 1
                    response.release()
                    self.metrics.lora_not_loaded.inc()
                    replica.note_unloaded(adapter)
                    continue
            if waited:
                self.metrics.queue_wait.observe(waited)
            self.metrics.picks.labels(replica.url, reason).inc()
            trace.answered(response.status)
            return replica, response, prefetched

    def _choose(self, path: str, parsed, text: str, adapter: str | None, tenant: Tenant = ANONYMOUS):
        """A continuation of a stored response goes to the replica that answered it (it alone holds it). A request
        for an adapter goes to a replica that has it loaded. Prefix affinity keys prefixes as the replicas do: by
        adapter, the tenant's sharing scope and the request's cache_salt."""
        available = self.replicas.available() if adapter is None else self.adapters.holders(adapter)
        available = available if self.pool is None else self.pool.candidates(available)
        if path == RESPONSES_PATH and isinstance(parsed, dict):
            owner = self.response_owners.owner(parsed.get("previous_response_id"))
            for replica in available:
                if replica.url == owner:
                    return replica, "response"
        scope = cache_scope(tenant, parsed, self.chooser.settings.prefix_cache_sharing)
        return self.chooser.choose(available, text, adapter, scope)

    def _unreachable(self, unreachable: LoadUnreachable, deadline: float, what: str) -> None:
        """A replica did not answer the router's own request (a load, a sleep, a wake): out of the pick for a while;
        `Refused` (503) past the deadline."""
        self.replicas.mark_down(unreachable.replica, str(unreachable), FAILED_HOLD_SECONDS)
        self.chooser.forget(unreachable.replica)
        if time.monotonic() >= deadline:
            raise Refused(503, f"{what}; retry later", "no_replica", self.queue_timeout) from None

    async def _relay(self, response: Response, replica: Replica, send, prefetched: bytes | None, learn,
                     progress: StreamProgress | None, started: bool) -> UpstreamError | None:
        """Relays the answer (its start only if the client has none yet); returns the replica's failure, if it
        failed before the end. A resumable stream is relayed event by event through `progress`; its end is sent
        only if the stream completed."""
        finished = False   # the replica's answer was read whole
        body_closed = False   # the client's response body was ended (`more_body` False)
        track = progress if progress is not None and response.status == 200 else None
        try:
            if not started:
                await send({"type": "http.response.start", "status": response.status,
                            "headers": response_headers(response, replica.url)})
            if prefetched is not None:
                await send({"type": "http.response.body", "body": prefetched, "more_body": False})
                body_closed = True
            else:
                async for chunk in response.chunks():
                    if learn is not None:   # a Responses answer: its id is in its first chunk
                        learn(chunk, replica.url)
                        learn = None
                    if track is not None:
                        chunk = track.feed(chunk)
                        if track.failed is not None:   # its engine died: the events before go out, the rest elsewhere
                            if chunk:
                                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                            raise EngineDied(f"its engine failed: {track.failed}")
                        if not chunk and not response.ended:
                            continue
                    body_closed = response.ended   # the last chunk goes with the end of the body: one write less
                    await send({"type": "http.response.body", "body": chunk, "more_body": not body_closed})
            finished = True
        except UpstreamError as error:
            self.metrics.upstream_errors.labels("engine_dead" if isinstance(error, EngineDied) else "disconnect").inc()
            logger.warning("replica %s failed mid-response: %s", replica.url, error)
            return error
        finally:
            replica.in_flight -= 1
            if finished:
                response.release()
            else:
                response.close()   # the replica sees the connection close and aborts the request
        if not body_closed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None

    async def _end_with_error(self, send, message: str) -> None:
        """Ends a stream whose response started with an OpenAI-style error event."""
        self.metrics.resumes.labels("failed").inc()
        await send({"type": "http.response.body", "body": sse_error(message), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
