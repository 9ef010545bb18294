"""The KV protocol's bytes on a stream socket.

A connection starts with a preamble from each side, `MAGIC` and the protocol version, so that a version mismatch (or
a port that is not a KV endpoint) is named before any frame is parsed. Then frames, each
`kind (u8) | payload length (u32) | crc32 of the payload (u32) | payload`:

    decode -> prefill   HELLO      JSON: layout, prompt token ids, first-token sampling settings, blocks it skips
    prefill -> decode   ACCEPT     JSON: the prefill side's layout and how many blocks will follow
                        BLOCK      u32 block index, then the block's bytes: `[2, layers, block_size, heads, dim]`
                        KEEPALIVE  empty, after each `keepalive_s` of silence (the prompt may wait in a queue)
                        DONE       JSON: the first output token
                        ERROR      JSON: code and message; the connection then closes

Blocks are sent in index order as the prefill computes them. A decode side that gives up closes the connection.
The checksum is the standard CRC-32 (zlib's); ISA-L's implementation of it, when installed, computes the same values
about four times faster (benchmarks/kv_transfer.py), so either side may have it or not.
"""
import enum
import json
import socket
import struct

try:
    from isal.isal_zlib import crc32
except ImportError:   # the same checksum, slower
    from zlib import crc32

from kubeinfer.runtime.disagg.errors import PeerClosedError, ProtocolVersionError, TransferTimeoutError, ChecksumError

MAGIC = b"KIKV"
PROTOCOL_VERSION = 1
PREAMBLE = struct.Struct("!4sH")
FRAME_HEADER = struct.Struct("!BII")
BLOCK_INDEX = struct.Struct("!I")
MAX_JSON_BYTES = 64 << 20   # a HELLO carries the prompt's token ids: far below this for any real context


class Kind(enum.IntEnum):
    HELLO = 1
    ACCEPT = 2
    BLOCK = 3
    DONE = 4
    ERROR = 5
    KEEPALIVE = 6


def checksum(buffers, value: int = 0) -> int:
    for buffer in buffers:
        value = crc32(buffer, value)
    return value


def send_buffers(sock: socket.socket, buffers: list) -> None:
    """Sends every buffer, in order, with as few system calls as the kernel allows (no joining copy)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    try:
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if sent:
                views[0] = views[0][sent:]
    except TimeoutError:
        raise TransferTimeoutError("the peer took no bytes for the idle timeout (stalled or overloaded)") from None
    except (BrokenPipeError, ConnectionResetError) as error:
        raise PeerClosedError(f"the peer closed the connection ({error.strerror})") from None


def receive_into(sock: socket.socket, buffer) -> None:
    """Fills `buffer` from the socket."""
    view = memoryview(buffer).cast("B")
    try:
        while view:
            received = sock.recv_into(view)
            if received == 0:
                raise PeerClosedError("the peer closed the connection mid-transfer")
            view = view[received:]
    except TimeoutError:
        raise TransferTimeoutError("the peer sent nothing for the idle timeout (stalled, or not a KV endpoint)") \
            from None
    except ConnectionResetError:
        raise PeerClosedError("the peer reset the connection") from None


def send_preamble(sock: socket.socket, version: int = PROTOCOL_VERSION) -> None:
    send_buffers(sock, [PREAMBLE.pack(MAGIC, version)])


def check_preamble(sock: socket.socket, peer: str) -> None:
    buffer = bytearray(PREAMBLE.size)
    receive_into(sock, buffer)
    magic, version = PREAMBLE.unpack(buffer)
    if magic != MAGIC:
        raise ProtocolVersionError(f"{peer} is not a kubeinfer KV endpoint (it sent {bytes(buffer)!r})")
    if version != PROTOCOL_VERSION:
        raise ProtocolVersionError(f"{peer} speaks KV protocol version {version}; this replica speaks "
                                   f"version {PROTOCOL_VERSION}: run the same kubeinfer version on both")


def send_frame(sock: socket.socket, kind: Kind, parts: list) -> None:
    length = sum(memoryview(part).nbytes for part in parts)
    send_buffers(sock, [FRAME_HEADER.pack(kind, length, checksum(parts)), *parts])


def send_json(sock: socket.socket, kind: Kind, body: dict) -> None:
    send_frame(sock, kind, [json.dumps(body).encode()])


def read_header(sock: socket.socket) -> tuple[Kind, int, int]:
    buffer = bytearray(FRAME_HEADER.size)
    receive_into(sock, buffer)
    kind, length, crc = FRAME_HEADER.unpack(buffer)
    try:
        return Kind(kind), length, crc
    except ValueError:
        raise ProtocolVersionError(f"unknown frame kind {kind}: the peer's protocol differs") from None


def read_json(sock: socket.socket, length: int, crc: int) -> dict:
    if length > MAX_JSON_BYTES:
        raise ProtocolVersionError(f"a control frame of {length} bytes: the peer's protocol differs")
    buffer = bytearray(length)
    receive_into(sock, buffer)
    verify(crc, [buffer])
    return json.loads(buffer)


def verify(expected: int, buffers) -> None:
    if checksum(buffers) != expected:
        raise ChecksumError("a frame's checksum does not match its bytes (corrupted on the way)")
