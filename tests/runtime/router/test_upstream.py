"""The router's HTTP/1.1 client against a scripted server on loopback: what it writes, what it reads, when it
reuses a connection, and how each failure surfaces."""
import asyncio
import socket

import pytest

from kubeinfer.runtime.router.upstream import PAUSE_BYTES, ConnectFailed, Upstream, UpstreamError


class ScriptedServer:
    """Answers each request with the next bytes of `answers` (or calls it: `answer(writer)`), keeping the
    connection open unless told; records connections and the raw requests."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.server = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if callable(answer):
                    if await answer(writer) == "close":
                        break
                else:
                    writer.write(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def plain(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(*chunks: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


async def test_requests_are_written_whole_and_keep_alive_responses_reuse_one_connection():
    async with ScriptedServer([plain(b'{"a": 1}', "x-extra: yes"), chunked(b"data: 1\n\n", b"data: 2\n\n"),
                               plain(b"m 1\n")]) as server:
        upstream = Upstream(server.url, connect_timeout=1)
        response = await upstream.request("POST", "/v1/completions",
                                          [(b"content-type", b"application/json"), (b"authorization", b"Bearer k")],
                                          b'{"prompt": "hi"}')
        assert (response.status, response.header(b"x-extra")) == (200, b"yes")
        assert await response.read() == b'{"a": 1}'
        response.release()
        response = await upstream.request("POST", "/v1/chat/completions", [], b"{}")
        assert response.header(b"transfer-encoding") == b"chunked"
        assert [chunk async for chunk in response.chunks()] == [b"data: 1\n\n", b"data: 2\n\n"]
        response.release()
        assert await upstream.get("/metrics", timeout=1) == (200, b"m 1\n")
    assert server.connections == 1
    host = server.url.removeprefix("http://")
    assert server.requests[0] == (f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-length: 16\r\n"
                                  "content-type: application/json\r\nauthorization: Bearer k\r\n\r\n"
                                  '{"prompt": "hi"}').encode()
    assert server.requests[2].startswith(b"GET /metrics HTTP/1.1\r\n")


async def test_a_response_closed_before_its_end_drops_the_connection_and_the_server_sees_it():
    seen_eof = asyncio.Event()

    async def endless(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        try:
            while True:   # a stream that would go on: only the client closing ends it
                await asyncio.sleep(0.01)
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
        except ConnectionError:
            seen_eof.set()
        return "close"
    async with ScriptedServer([endless, plain(b"ok")]) as server:
        upstream = Upstream(server.url, connect_timeout=1)
        response = await upstream.request("POST", "/v1/completions", [], b"{}")
        assert await anext(response.chunks()) == b"first"
        response.close()
        await asyncio.wait_for(seen_eof.wait(), 5)
        status, body = await upstream.get("/next", timeout=1)   # a new connection
    assert (status, body, server.connections) == (200, b"ok", 2)


async def test_a_connection_broken_mid_body_raises_after_what_arrived():
    async def half(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nstart,\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        return "close"
    async with ScriptedServer([half]) as server:
        response = await Upstream(server.url, connect_timeout=1).request("POST", "/x", [], b"")
        got = []
        with pytest.raises(UpstreamError, match="connection"):
            async for chunk in response.chunks():
                got.append(chunk)
        assert got == [b"start,"]


async def test_a_replica_that_closes_before_answering_raises_upstream_error():
    async def hang_up(writer):
        return "close"
    async with ScriptedServer([hang_up]) as server:
        with pytest.raises(UpstreamError):
            await Upstream(server.url, connect_timeout=1).request("POST", "/x", [], b"{}")


async def test_a_kept_alive_connection_closed_before_answering_is_retried_once_on_a_new_one():
    async def hang_up(writer):
        return "close"
    async with ScriptedServer([plain(b"first"), hang_up, plain(b"retried")]) as server:
        upstream = Upstream(server.url, connect_timeout=1)
        assert await upstream.get("/1", timeout=1) == (200, b"first")
        assert await upstream.get("/2", timeout=1) == (200, b"retried")
    assert server.connections == 2 and len(server.requests) == 3


async def test_an_interim_100_continue_is_skipped_for_the_answer_after_it():
    async with ScriptedServer([b"HTTP/1.1 100 Continue\r\n\r\n" + plain(b"real", "x-n: 2")]) as server:
        response = await Upstream(server.url, connect_timeout=1).request("POST", "/x", [], b"{}")
        assert (response.status, response.header(b"x-n"), await response.read()) == (200, b"2", b"real")


async def test_not_http_raises_upstream_error():
    async with ScriptedServer([b"SSH-2.0-OpenSSH\r\n\r\n"]) as server:
        with pytest.raises(UpstreamError, match="bad HTTP"):
            await Upstream(server.url, connect_timeout=1).request("GET", "/x")


async def test_connection_close_and_idle_connections_closed_by_the_replica_are_not_reused():
    async def answer_then_close(writer):
        writer.write(plain(b"one"))
        await writer.drain()
        return "close"
    async with ScriptedServer([plain(b"zero", "connection: close"), answer_then_close, plain(b"two")]) as server:
        upstream = Upstream(server.url, connect_timeout=1)
        assert await upstream.get("/0", timeout=1) == (200, b"zero")
        assert await upstream.get("/1", timeout=1) == (200, b"one")
        await asyncio.sleep(0.05)   # the server's close reaches the idle connection
        assert await upstream.get("/2", timeout=1) == (200, b"two")
    assert server.connections == 3


async def test_refused_and_timed_out_connections_raise_connect_failed():
    with socket.socket() as closed:   # bound, never listening: connections are refused, and no one else gets it
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        with pytest.raises(ConnectFailed, match="cannot connect") as refused:
            await Upstream(f"http://127.0.0.1:{port}", connect_timeout=1).request("GET", "/")
    assert not refused.value.timed_out
    # A listener that never accepts, its backlog full: the next handshake gets no answer.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        held = socket.create_connection(full.getsockname(), timeout=1)   # the one place in the queue
        try:
            with pytest.raises(ConnectFailed, match="within 0.3 s") as timed_out:
                await Upstream(f"http://127.0.0.1:{full.getsockname()[1]}", connect_timeout=0.3).request("GET", "/")
            assert timed_out.value.timed_out
        finally:
            held.close()


async def test_a_slow_reader_pauses_the_replica_instead_of_buffering_everything():
    body = bytes(range(256)) * (4 * PAUSE_BYTES // 256)
    async with ScriptedServer([plain(body)]) as server:
        response = await Upstream(server.url, connect_timeout=1).request("GET", "/big")
        for _ in range(500):   # not reading the body: the client must stop reading the socket
            if not response.connection.transport.is_reading():
                break
            await asyncio.sleep(0.01)
        assert not response.connection.transport.is_reading()
        await asyncio.sleep(0.1)   # and stay paused: nothing more is buffered
        assert PAUSE_BYTES <= response._buffered < 2 * PAUSE_BYTES
        assert await response.read() == body
        response.release()
