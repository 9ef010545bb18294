"""The prefill replica's KV endpoint over TCP: a listener, and one thread per transfer that sends its blocks.

Backpressure: a stream takes at most `max_blocks_in_flight` blocks beyond those sent; the exporter keeps the rest
in its cache until the socket drains. A send that makes no progress for the idle timeout (the decode side stopped
reading) breaks the transfer, as does a closed peer; either way the engine is woken to free the blocks.
"""
import collections
import logging
import socket
import threading
from collections.abc import Callable

import torch

from kubeinfer.runtime.disagg.block_io import BlockBuffers
from kubeinfer.runtime.disagg.connector import ExportStream, KVSource, PullRequest, TransferTimeouts
from kubeinfer.runtime.disagg.errors import ProtocolVersionError, TransferError
from kubeinfer.runtime.disagg.layout import KVLayout
from kubeinfer.runtime.disagg.wire import (BLOCK_INDEX, Kind, check_preamble, read_header, read_json, send_frame,
                                           send_json, send_preamble)

logger = logging.getLogger(__name__)
DEFAULT_BLOCKS_IN_FLIGHT = 16


class TcpExportStream(ExportStream):
    def __init__(self, sock: socket.socket, blocks: BlockBuffers, capacity: int, keepalive_s: float,
                 on_progress: Callable[[], None]):
        self._sock, self._blocks, self._capacity = sock, blocks, capacity
        self._keepalive_s, self._on_progress = keepalive_s, on_progress
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._num_queued = self._num_sent = 0
        self._error: str | None = None
        self._closed = False

    def room(self) -> int:
        if self._error is not None or self._closed:
            return 0
        return self._capacity - (self._num_queued - self._num_sent)

    def send_block(self, index: int, block_id: int) -> None:
        self._put((Kind.BLOCK, index, block_id))
        self._num_queued += 1

    @property
    def num_sent(self) -> int:
        return self._num_sent

    def finish(self, first_token: int) -> None:
        self._put((Kind.DONE, first_token, None))

    def fail(self, message: str) -> None:
        self._put((Kind.ERROR, message, None))

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def closed(self) -> bool:
        return self._closed

    def _put(self, item: tuple) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def run(self) -> None:
        """The stream's sending loop, on its connection's thread, until it ends or breaks."""
        try:
            while True:
                with self._ready:
                    if not self._items:
                        self._ready.wait(self._keepalive_s)
                    item = self._items.popleft() if self._items else None
                if item is None:
                    send_frame(self._sock, Kind.KEEPALIVE, [])
                    continue
                kind, value, block_id = item
                if kind is Kind.BLOCK:
                    send_frame(self._sock, Kind.BLOCK,
                               [BLOCK_INDEX.pack(value), *self._blocks.read(block_id)])
                    self._num_sent += 1
                    self._on_progress()
                elif kind is Kind.DONE:
                    send_json(self._sock, Kind.DONE, {"first_token": value})
                    return
                else:
                    send_json(self._sock, Kind.ERROR, {"code": "prefill", "message": value})
                    return
        except (TransferError, OSError) as error:
            self._error = str(error)
        finally:
            self._sock.close()
            self._closed = True
            self._on_progress()


class TcpKVSource(KVSource):
    def __init__(self, layout: KVLayout, kv_cache: torch.Tensor, host: str = "0.0.0.0", port: int = 0,
                 timeouts: TransferTimeouts = TransferTimeouts(),
                 max_blocks_in_flight: int = DEFAULT_BLOCKS_IN_FLIGHT):
        self.layout, self.blocks, self.timeouts = layout, BlockBuffers(kv_cache), timeouts
        self.max_blocks_in_flight = max_blocks_in_flight
        self._listener = socket.create_server((host, port))
        self._host = host
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def start(self, on_pull, on_progress) -> None:
        threading.Thread(target=self._accept, args=(on_pull, on_progress), name="kv-source", daemon=True).start()
        logger.info("KV source listening on %s (%s)", self.address, self.layout)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:   # closed already
                    pass

    def _accept(self, on_pull, on_progress) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:   # closed
                return
            threading.Thread(target=self._serve, args=(conn, f"{peer[0]}:{peer[1]}", on_pull, on_progress),
                             name="kv-export", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str, on_pull, on_progress) -> None:
        with self._lock:
            self._connections.add(conn)
        try:
            conn.settimeout(self.timeouts.idle_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request = self._handshake(conn, peer)
            if request is None:
                return
            stream = TcpExportStream(conn, self.blocks, self.max_blocks_in_flight, self.timeouts.keepalive_s,
                                     on_progress)
            on_pull(request, stream)
            stream.run()
        except (TransferError, OSError, KeyError, TypeError, ValueError) as error:   # the last three: a bad HELLO
            logger.warning("KV transfer to %s refused or broken: %r", peer, error)
        finally:
            conn.close()
            with self._lock:
                self._connections.discard(conn)

    def _handshake(self, conn: socket.socket, peer: str) -> PullRequest | None:
        """Reads the decode side's HELLO; answers ACCEPT, or ERROR and None when the layouts differ."""
        send_preamble(conn)
        check_preamble(conn, f"the decode replica at {peer}")
        kind, length, crc = read_header(conn)
        if kind is not Kind.HELLO:
            raise ProtocolVersionError(f"the decode replica at {peer} opened with {kind.name}, not HELLO")
        hello = read_json(conn, length, crc)
        mismatch = self.layout.mismatch(KVLayout.from_json(hello["layout"]), "prefill", "decode")
        if mismatch is not None:
            message = f"the prefill replica at {self.address} serves another KV layout: {mismatch}"
            logger.warning("KV pull from %s refused: %s", peer, message)
            send_json(conn, Kind.ERROR, {"code": "layout", "message": message})
            return None
        send_json(conn, Kind.ACCEPT, {"layout": self.layout.to_json()})
        traceparent = hello.get("traceparent")   # absent from a decode replica that does not trace
        return PullRequest(list(hello["token_ids"]), dict(hello["params"]), int(hello["num_skip_blocks"]),
                           traceparent if isinstance(traceparent, str) and len(traceparent) <= 128 else None)
