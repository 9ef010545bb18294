"""The TCP transport alone, on synthetic caches: blocks arrive whole, in place, skipping what the puller holds;
corrupted, stalled, foreign or closed peers end the transfer with an error that says so, and never hang."""
import socket
import threading
import time

import pytest
import torch

from kubeinfer.runtime.disagg.connector import PullRequest, TransferTimeouts
from kubeinfer.runtime.disagg.errors import (ChecksumError, LayoutMismatchError, ProtocolVersionError,
                                             TransferError, TransferTimeoutError)
from kubeinfer.runtime.disagg.layout import KVLayout
from kubeinfer.runtime.disagg.tcp_puller import TcpKVPuller
from kubeinfer.runtime.disagg.tcp_source import TcpKVSource
from kubeinfer.runtime.disagg.wire import BLOCK_INDEX, FRAME_HEADER, Kind, check_preamble, send_json, send_preamble
from support.disagg import accept_pull, fake_prefill

pytestmark = pytest.mark.timeout(60)
IDLE = TransferTimeouts(connect_s=2.0, idle_s=0.5)


def cache(layout: KVLayout, num_blocks: int, seed: int | None) -> torch.Tensor:
    shape = (2, layout.num_layers, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
    if seed is None:
        return torch.zeros(shape, dtype=getattr(torch, layout.dtype))
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(getattr(torch, layout.dtype))


LAYOUT = KVLayout("m", "bfloat16", 4, 3, 2, 8)


def serve_blocks(source: TcpKVSource, block_ids: list[int], first_token: int = 7):
    """Starts `source`, answering each pull with `block_ids` from the skipped index on (as the exporter would)."""
    def on_pull(request: PullRequest, stream):
        def send():
            for index in range(request.num_skip_blocks, len(block_ids)):
                while stream.room() == 0:
                    time.sleep(0.001)
                stream.send_block(index, block_ids[index])
            stream.finish(first_token)
        threading.Thread(target=send, daemon=True).start()
    source.start(on_pull, lambda: None)


def test_blocks_land_in_place_and_skipped_ones_are_not_sent():
    sent = cache(LAYOUT, 6, seed=1)
    source = TcpKVSource(LAYOUT, sent, "127.0.0.1", timeouts=IDLE, max_blocks_in_flight=2)
    serve_blocks(source, [5, 0, 3, 1])
    received = cache(LAYOUT, 8, seed=None)
    puller = TcpKVPuller(LAYOUT, received, IDLE)
    token = puller.pull(source.address, PullRequest([1] * 14, {}, num_skip_blocks=1), [6, 2, 4])
    assert token == 7
    for here, there in ((6, 0), (2, 3), (4, 1)):
        assert torch.equal(received[:, :, here], sent[:, :, there])
    untouched = [b for b in range(8) if b not in (6, 2, 4)]
    assert not received[:, :, untouched].any()
    source.close()


def test_another_layout_is_refused_with_the_difference_named():
    source = TcpKVSource(LAYOUT, cache(LAYOUT, 2, seed=1), "127.0.0.1", timeouts=IDLE)
    serve_blocks(source, [0, 1])
    other = KVLayout("other-model", "float16", 4, 3, 2, 8)
    puller = TcpKVPuller(other, cache(other, 2, seed=None), IDLE)
    with pytest.raises(LayoutMismatchError, match=r"model 'm' on prefill, 'other-model' on decode; "
                                                  r"dtype 'bfloat16' on prefill, 'float16' on decode"):
        puller.pull(source.address, PullRequest([1] * 5, {}), [0, 1])
    source.close()


def test_a_closed_port_is_refused_at_once():
    with socket.socket() as probe:   # bound, never listening: connections are refused, and no one else gets it
        probe.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % probe.getsockname()[1]
        puller = TcpKVPuller(LAYOUT, cache(LAYOUT, 2, seed=None), IDLE)
        with pytest.raises(TransferError, match="connection refused"):
            puller.pull(address, PullRequest([1, 2], {}), [0])


def test_a_protocol_version_mismatch_is_named():
    address = fake_prefill(lambda conn: (send_preamble(conn, version=2), time.sleep(IDLE.idle_s)))
    puller = TcpKVPuller(LAYOUT, cache(LAYOUT, 2, seed=None), IDLE)
    with pytest.raises(ProtocolVersionError, match="speaks KV protocol version 2; this replica speaks version 1"):
        puller.pull(address, PullRequest([1, 2], {}), [0])


def test_the_source_refuses_a_puller_of_another_version():
    source = TcpKVSource(LAYOUT, cache(LAYOUT, 2, seed=1), "127.0.0.1", timeouts=IDLE)
    pulls = []
    source.start(lambda request, stream: pulls.append(request), lambda: None)
    host, port = source.address.split(":")
    with socket.create_connection((host, int(port)), timeout=IDLE.idle_s * 4) as conn:
        send_preamble(conn, version=2)
        check_preamble(conn, "the source")   # it speaks version 1 ...
        assert conn.recv(1) == b""           # ... and closes without reading a request
    assert pulls == []
    source.close()


def test_a_stalled_prefill_times_out_after_the_idle_timeout():
    release = threading.Event()
    address = fake_prefill(lambda conn: release.wait())   # accepts, then says nothing at all
    puller = TcpKVPuller(LAYOUT, cache(LAYOUT, 2, seed=None), IDLE)
    started = time.monotonic()
    with pytest.raises(TransferTimeoutError, match="sent nothing for the idle timeout"):
        puller.pull(address, PullRequest([1, 2], {}), [0])
    assert time.monotonic() - started >= IDLE.idle_s
    release.set()


def test_a_corrupted_block_fails_its_checksum():
    def corrupt(conn):
        accept_pull(conn, LAYOUT)
        payload = BLOCK_INDEX.pack(0) + bytes(LAYOUT.block_bytes)
        conn.sendall(FRAME_HEADER.pack(Kind.BLOCK, len(payload), 12345) + payload)
        time.sleep(IDLE.idle_s)
    puller = TcpKVPuller(LAYOUT, cache(LAYOUT, 2, seed=None), IDLE)
    with pytest.raises(ChecksumError):
        puller.pull(fake_prefill(corrupt), PullRequest([1, 2], {}), [0])


def test_a_puller_that_stops_reading_breaks_the_stream_after_the_idle_timeout():
    big = KVLayout("m", "float32", 16, 32, 8, 128)   # 4 MiB blocks: the socket buffers fill after a few
    source = TcpKVSource(big, cache(big, 2, seed=None), "127.0.0.1", timeouts=IDLE, max_blocks_in_flight=64)
    streams, progress = [], threading.Event()

    def on_pull(request, stream):
        for index in range(64):
            stream.send_block(index, index % 2)
        streams.append(stream)
    source.start(on_pull, progress.set)
    host, port = source.address.split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        send_preamble(conn)
        send_json(conn, Kind.HELLO, {"layout": big.to_json(), "token_ids": [1] * 1024, "params": {},
                                     "num_skip_blocks": 0})
        deadline = time.monotonic() + 20 * IDLE.idle_s   # far beyond the idle timeout it must break at
        while not (streams and streams[0].closed) and time.monotonic() < deadline:
            progress.wait(IDLE.idle_s)
            progress.clear()
        assert streams and streams[0].closed
        assert "took no bytes for the idle timeout" in streams[0].error
        assert streams[0].num_sent < 64
    source.close()
