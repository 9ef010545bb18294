"""HTTP/1.1 to one replica: a pool of keep-alive connections, one request at a time on each, the response read as
it arrives.

The router's only client (proxied requests and `/metrics` scrapes). It is an `asyncio.Protocol` with the
`httptools` (llhttp) parser rather than a general client library: a request is one `write` of bytes built in one
join, and each body chunk reaches the caller the moment it is parsed, with no per-request objects beyond these
two. On this project's 2-core box, uvicorn on uvloop and httptools with aiohttp as the client added 1.1-1.4 ms to
a request's time to first token; with this client, 0.4-0.8 ms (docs/benchmarks/serving-features.md, "Router").

- `ConnectFailed`: the request never reached the replica (refused, unreachable, connect timeout): safe to send
  it elsewhere.
- `UpstreamError`: the connection broke after the request was written, or the answer was not HTTP.
- A response must be read to its end (`chunks()`/`read()`) and then `release()`d, which returns its connection
  to the pool; `close()` drops the connection instead, which is how the router cancels a request (the replica
  sees the connection close and aborts it).
"""
import asyncio
import collections
import ssl
import time
from urllib.parse import urlsplit

import httptools

IDLE_SECONDS = 30.0          # an idle connection is dropped after this (the replicas keep theirs 65 s)
MAX_IDLE = 64                # idle connections kept per replica
PAUSE_BYTES = 1 << 20        # unread response bytes at which reading from the replica pauses


class ConnectFailed(Exception):
    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class UpstreamError(Exception):
    """The replica's connection broke after the request was sent, or it answered something that is not HTTP."""


class ClosedBeforeAnswer(UpstreamError):
    """The connection closed before a byte of any answer came back on it."""


class Connection(asyncio.Protocol):
    """One keep-alive connection; `httptools` calls the `on_*` methods while `data_received` feeds it."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = time.monotonic()
        self._response: "Response | None" = None
        self._bytes_in = False   # anything received for the current request yet

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._bytes_in = True
        if self._response is None:   # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._response._fail(UpstreamError(f"bad HTTP from the replica: {error}"))
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._response is not None:
            error = UpstreamError if self._bytes_in else ClosedBeforeAnswer
            self._response._fail(error(f"connection lost: {exc}" if exc else "connection closed"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self._response
        response.status = self.parser.get_status_code()
        if response.status < 200:   # an interim answer (100 Continue): the real one follows
            response.headers.clear()
            return
        if not response.started.done():
            response.started.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._response._push(body)

    def on_message_complete(self) -> None:
        response = self._response
        if response.status < 200:
            return
        response.complete = True
        response.keep_alive = self.parser.should_keep_alive()
        response._wake()

    def pause(self) -> None:
        self.transport.pause_reading()

    def resume(self) -> None:
        if not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """A response being read: `status` and `headers` (lower-case names) once `started`, then the body."""

    def __init__(self, connection: Connection, pool: "Upstream"):
        self.connection, self.pool = connection, pool
        self.started = asyncio.get_running_loop().create_future()
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future | None = None
        self._done = False

    @property
    def ended(self) -> bool:
        """The whole body arrived and was handed out."""
        return self.complete and not self._chunks

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    async def chunks(self):
        """The body as it arrives (chunked encoding removed); raises `UpstreamError` if the connection breaks."""
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < PAUSE_BYTES // 2:
                    self._paused = False
                    self.connection.resume()
                yield chunk
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if the response was read whole, else closes."""
        if self._done:
            return
        self._done = True
        self.connection._response = None
        if self.complete and self.keep_alive and not self._chunks and not self.connection.closed:
            self.pool._put(self.connection)
        else:
            self.connection.close()

    def close(self) -> None:
        """Done with it before its end: closes the connection (the replica aborts the request)."""
        self._done = True
        self.connection._response = None
        self.connection.close()

    def _push(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if not self._paused and self._buffered >= PAUSE_BYTES:
            self._paused = True
            self.connection.pause()
        self._wake()

    def _fail(self, error: Exception) -> None:
        if self.complete:
            return
        self._error = error
        if not self.started.done():
            self.started.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Upstream:
    """The connections to one replica (`http://HOST:PORT` or `https://...`)."""

    def __init__(self, url: str, connect_timeout: float):
        parts = urlsplit(url)
        self.url = url
        self.host, self.connect_timeout = parts.hostname, connect_timeout
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.host_header = parts.netloc.encode()
        self._idle: list[Connection] = []

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]] = (),
                      body: bytes = b"") -> Response:
        """Sends the request and returns once the response's status and headers are in.

        A kept-alive connection that the replica closed before answering a byte (its idle timeout, its shutdown)
        is retried once on a new connection: the request was never read there."""
        head = [f"{method} {path} HTTP/1.1\r\nhost: ".encode(), self.host_header,
                f"\r\ncontent-length: {len(body)}\r\n".encode()]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head += (b"\r\n", body)
        message = b"".join(head)
        connection = self._take()
        if connection is not None:
            try:
                return await self._send(connection, message)
            except UpstreamError as error:
                if not isinstance(error, ClosedBeforeAnswer):
                    raise
        return await self._send(await self._connect(), message)

    async def _send(self, connection: Connection, message: bytes) -> Response:
        response = Response(connection, self)
        connection._response, connection._bytes_in = response, False
        connection.transport.write(message)
        try:
            await response.started
        except BaseException:
            response.close()
            raise
        return response

    async def fetch(self, method: str, path: str, headers: list[tuple[bytes, bytes]] = (),
                    body: bytes = b"") -> tuple[Response, bytes]:
        """A small request read whole: its response (the connection given back) and the body."""
        response = await self.request(method, path, headers, body)
        try:
            answer = await response.read()
        except BaseException:
            response.close()
            raise
        response.release()
        return response, answer

    async def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        """(status, body) of a small GET, all within `timeout` seconds (`asyncio.TimeoutError` past it)."""
        async def whole() -> tuple[int, bytes]:
            response, body = await self.fetch("GET", path)
            return response.status, body
        return await asyncio.wait_for(whole(), timeout)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _take(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        return None

    def _put(self, connection: Connection) -> None:
        if len(self._idle) >= MAX_IDLE:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(Connection, self.host, self.port, ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None),
                self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectFailed(f"no connection to {self.url} within {self.connect_timeout:g} s",
                                timed_out=True) from None
        except OSError as error:
            raise ConnectFailed(f"cannot connect to {self.url}: {error.strerror or error}") from None
        return connection
