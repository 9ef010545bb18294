"""The decode replica's end of a TCP transfer: connects to the prefill replica, asks for the prompt's KV, and
writes each block straight into its own cache as it arrives.

Everything it waits for is bounded: the connection by `connect_s`, every read by `idle_s` (the prefill side sends
a keepalive every `idle_s / 4` while it computes). `cancel()` shuts the socket, which ends a read at once.
"""
import logging
import socket
import threading
from collections.abc import Callable

import torch

from kubeinfer.runtime.disagg.block_io import BlockBuffers
from kubeinfer.runtime.disagg.connector import KVPuller, PullHandle, PullRequest, TransferTimeouts
from kubeinfer.runtime.disagg.errors import (LayoutMismatchError, PeerClosedError, ProtocolVersionError,
                                             TransferError)
from kubeinfer.runtime.disagg.layout import KVLayout
from kubeinfer.runtime.disagg.wire import (BLOCK_INDEX, Kind, check_preamble, read_header, read_json,
                                           receive_into, send_json, send_preamble, verify)

logger = logging.getLogger(__name__)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TransferError(f"a KV source address is host:port, got {address!r}")
    return host.strip("[]"), int(port)


class TcpKVPuller(KVPuller):
    def __init__(self, layout: KVLayout, kv_cache: torch.Tensor, timeouts: TransferTimeouts = TransferTimeouts()):
        self.layout, self.blocks, self.timeouts = layout, BlockBuffers(kv_cache), timeouts

    def start(self, address: str, request: PullRequest, block_ids: list[int],
              on_done: Callable[[], None]) -> PullHandle:
        handle = PullHandle()
        pull = _TcpPull(self, address, request, block_ids, handle, on_done)
        handle.cancel = pull.cancel
        threading.Thread(target=pull.run, name="kv-pull", daemon=True).start()
        return handle

    def pull(self, address: str, request: PullRequest, block_ids: list[int]) -> int:
        """The same, waiting for the end: the first token, or the transfer's error raised."""
        handle = self.start(address, request, block_ids, lambda: None)
        handle.done.wait()
        if handle.error is not None:
            raise handle.error
        return handle.first_token


class _TcpPull:
    def __init__(self, puller: TcpKVPuller, address: str, request: PullRequest, block_ids: list[int],
                 handle: PullHandle, on_done: Callable[[], None]):
        self.puller, self.address, self.request, self.block_ids = puller, address, request, block_ids
        self.handle, self.on_done = handle, on_done
        self.sock: socket.socket | None = None
        self.cancelled = False
        self.lock = threading.Lock()

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:   # closed already
                    pass

    def run(self) -> None:
        try:
            self.handle.first_token = self._transfer()
        except TransferError as error:
            self.handle.error = error
        except OSError as error:
            self.handle.error = TransferError(f"KV transfer from {self.address} failed: {error}")
        finally:
            if self.sock is not None:
                self.sock.close()
            if self.cancelled and self.handle.error is None and self.handle.first_token is None:
                self.handle.error = TransferError("cancelled")
            self.handle.done.set()
            self.on_done()

    def _connect(self) -> socket.socket:
        host, port = split_address(self.address)
        try:
            sock = socket.create_connection((host, port), timeout=self.puller.timeouts.connect_s)
        except ConnectionRefusedError:
            raise TransferError(f"cannot reach the prefill replica's KV port at {self.address}: connection "
                                "refused (nothing listens there)") from None
        except TimeoutError:
            raise TransferError(f"cannot reach the prefill replica's KV port at {self.address}: no answer in "
                                f"{self.puller.timeouts.connect_s} s") from None
        with self.lock:
            self.sock = sock
            if self.cancelled:
                raise TransferError("cancelled")
        sock.settimeout(self.puller.timeouts.idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _transfer(self) -> int:
        sock, layout, request = self._connect(), self.puller.layout, self.request
        send_preamble(sock)
        hello = {"layout": layout.to_json(), "token_ids": request.token_ids, "params": request.params,
                 "num_skip_blocks": request.num_skip_blocks}
        if request.traceparent is not None:
            hello["traceparent"] = request.traceparent
        send_json(sock, Kind.HELLO, hello)
        check_preamble(sock, f"the prefill replica at {self.address}")
        num_blocks = len(self.block_ids)
        index_bytes = bytearray(BLOCK_INDEX.size)
        while True:
            kind, length, crc = read_header(sock)
            if kind is Kind.BLOCK:
                receive_into(sock, index_bytes)
                (index,) = BLOCK_INDEX.unpack(index_bytes)
                position = index - request.num_skip_blocks
                if position != self.handle.num_received or position >= num_blocks:
                    raise ProtocolVersionError(f"block {index} arrived out of order from {self.address}")
                buffers, filled = self.puller.blocks.destination(self.block_ids[position])
                if length != BLOCK_INDEX.size + sum(b.nbytes for b in buffers):
                    raise ProtocolVersionError(f"a block of {length} bytes from {self.address}: layouts differ")
                for buffer in buffers:
                    receive_into(sock, buffer)
                verify(crc, [index_bytes, *buffers])
                filled()
                self.handle.num_received += 1
                continue
            body = read_json(sock, length, crc) if kind is not Kind.KEEPALIVE else {}
            if kind is Kind.ERROR:
                error = LayoutMismatchError if body.get("code") == "layout" else TransferError
                raise error(body.get("message", "the prefill replica refused the transfer"))
            if kind is Kind.ACCEPT:
                mismatch = layout.mismatch(KVLayout.from_json(body["layout"]), "decode", "prefill")
                if mismatch is not None:
                    raise LayoutMismatchError(f"the prefill replica at {self.address} serves another KV layout: "
                                              f"{mismatch}")
            elif kind is Kind.DONE:
                if self.handle.num_received != num_blocks:
                    raise PeerClosedError(f"the prefill replica at {self.address} ended after "
                                          f"{self.handle.num_received} of {num_blocks} blocks")
                return int(body["first_token"])
            elif kind is Kind.HELLO:
                raise ProtocolVersionError(f"{self.address} answered HELLO with HELLO: not a prefill replica")
