"""Forwarding one request: wait for a replica, pick one, relay its answer byte for byte.

- A connection refused (or any failure or timeout to connect) never reached a replica: that replica is marked down and
  the request goes to another (or waits for one), within the request's deadline.
- A replica that answers 503 `draining` (it is shutting down; the request never reached its engine) is
  treated the same way, and left out of the pick for `DRAINING_HOLD_SECONDS`.
- Once the request reached a replica it is not retried (generation has effects: quota, tokens spent). A
  replica that dies mid-stream ends the stream with an OpenAI-style error event, as the runtime's own streams
  end when its engine dies; before the response started, the client gets a 502.
- The caller cancels `forward` when the client goes away; closing the upstream connection then makes the
  replica abort the request and free its KV blocks.
"""
import json
import logging
import time

from kubeinfer.runtime.router.affinity import prompt_text
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.policies import Chooser
from kubeinfer.runtime.router.replicas import ReplicaSet
from kubeinfer.runtime.router.response_owners import ResponseOwners
from kubeinfer.runtime.router.upstream import ConnectFailed, Response, UpstreamError
from kubeinfer.runtime.router.waiting_room import Refused, WaitingRoom

logger = logging.getLogger(__name__)
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-authorization",
              b"proxy-authenticate", b"trailer", b"host", b"content-length",
              b"expect"}   # uvicorn answered the client's `Expect: 100-continue`; the replica gets the whole body
REPLICA_HEADER = "x-kubeinfer-replica"
DRAINING_HOLD_SECONDS = 5.0


class UpstreamFailed(Exception):
    """The replica failed after the request reached it, before its response started."""


def request_headers(scope: dict) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]

RESPONSES_PATH = "/v1/responses"


def response_headers(response: Response, replica_url: str) -> list[tuple[bytes, bytes]]:
    headers = [(k, v) for k, v in response.headers if k not in HOP_BY_HOP - {b"content-length"}]
    return headers + [(REPLICA_HEADER.encode(), replica_url.encode())]


def sse_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": "replica_failed"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Proxy:
    def __init__(self, replicas: ReplicaSet, chooser: Chooser, room: WaitingRoom, metrics: RouterMetrics,
                 queue_timeout: float):
        self.replicas, self.chooser, self.room, self.metrics = replicas, chooser, room, metrics
        self.queue_timeout = queue_timeout
        self.response_owners = ResponseOwners()

    async def forward(self, scope: dict, body: bytes, send, received_at: float) -> None:
        """Sends the request to a replica and relays the response to `send`. Raises `Refused`/`UpstreamFailed`
        before anything was sent to the client."""
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None   # the replica answers bad JSON with its own 400
        text = prompt_text(parsed) if isinstance(parsed, dict) else ""
        headers = request_headers(scope)
        deadline = time.monotonic() + self.queue_timeout
        waited = 0.0
        while True:
            waited += await self.room.wait_until_up(len(body), deadline)
            replica, reason = self._choose(scope["path"], parsed, text)
            self.metrics.added.observe(time.perf_counter() - received_at - waited)
            replica.in_flight += 1
            try:
                response = await replica.upstream.request("POST", scope["path"], headers, body)
            except ConnectFailed as error:   # never reached it
                replica.in_flight -= 1
                self.metrics.upstream_errors.labels("timeout" if error.timed_out else "connect").inc()
                self.replicas.mark_down(replica, f"connect failed: {error}")
                self.chooser.forget(replica)   # a replica that comes back after this has an empty cache
                if time.monotonic() >= deadline:
                    raise Refused(503, "no replica could be reached; retry later", "no_replica",
                                  self.queue_timeout) from None
                continue
            except UpstreamError as error:
                replica.in_flight -= 1
                self.metrics.upstream_errors.labels("disconnect").inc()
                raise UpstreamFailed(f"replica {replica.url} failed: {error}") from None
            except BaseException:   # cancelled (the client left) while waiting for the response to start
                replica.in_flight -= 1
                raise
            prefetched = None
            if response.status == 503:   # small JSON error: read it to tell draining from other refusals
                try:
                    prefetched = await response.read()
                except BaseException as error:   # failed or cancelled while reading it
                    replica.in_flight -= 1
                    response.close()
                    if isinstance(error, UpstreamError):
                        raise UpstreamFailed(f"replica {replica.url} failed: {error}") from None
                    raise
                if b'"draining"' in prefetched:
                    replica.in_flight -= 1
                    response.release()
                    self.metrics.upstream_errors.labels("draining").inc()
                    self.replicas.mark_down(replica, "draining", DRAINING_HOLD_SECONDS)
                    if time.monotonic() >= deadline:
                        raise Refused(503, "no replica could take the request; retry later", "no_replica",
                                      self.queue_timeout)
                    continue
            break
        if waited:
            self.metrics.queue_wait.observe(waited)
        self.metrics.picks.labels(replica.url, reason).inc()
        learn = self.response_owners.learn if scope["path"] == RESPONSES_PATH and response.status == 200 else None
        await self._relay(response, replica, send, prefetched, learn)

    def _choose(self, path: str, parsed, text: str):
        """A continuation of a stored response goes to the replica that answered it (it alone holds it)."""
        available = self.replicas.available()
        if path == RESPONSES_PATH and isinstance(parsed, dict):
            owner = self.response_owners.owner(parsed.get("previous_response_id"))
            for replica in available:
                if replica.url == owner:
                    return replica, "response"
        return self.chooser.choose(available, text)

    async def _relay(self, response: Response, replica, send, prefetched: bytes | None, learn=None) -> None:
        finished = False   # the replica's answer was read whole
        body_closed = False   # the client's response body was ended (`more_body` False)
        try:
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
                    body_closed = response.ended   # the last chunk goes with the end of the body: one write less
                    await send({"type": "http.response.body", "body": chunk, "more_body": not body_closed})
            finished = True
        except UpstreamError as error:
            self.metrics.upstream_errors.labels("disconnect").inc()
            logger.warning("replica %s failed mid-response: %s", replica.url, error)
            if (response.header(b"content-type") or b"").startswith(b"text/event-stream"):
                await send({"type": "http.response.body", "more_body": True,
                            "body": sse_error(f"the replica serving this request failed: {error}")})
        finally:
            replica.in_flight -= 1
            if finished:
                response.release()
            else:
                response.close()   # the replica sees the connection close and aborts the request
        if not body_closed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
