"""The transport interface between the engine's roles and whatever moves KV blocks between replicas.

The decode side pulls: it opens a transfer to the prefill replica's KV endpoint, saying which prompt, how to sample
its first token, and how many leading blocks it already holds (its own prefix cache). The prefill side hands each
pull to the engine, which sends the prompt's blocks, in order, as its chunks are computed, then the first token.

Both sides name blocks by their id in their own cache, never by bytes: a host transport (TCP, here) reads and writes
the cache itself, and a device transport (NIXL/UCX, NCCL) would register the cache's memory once and move blocks
between devices, with the same calls. A block handed to `ExportStream.send_block` stays the exporter's until
`num_sent` passes it; nothing else may write it meanwhile.
"""
import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransferTimeouts:
    """`idle_s`: the longest silence either side accepts from the other (a sender with nothing to send says so every
    `idle_s / 4`, so it is never the prefill's compute or queueing time); `connect_s`: for the TCP connection."""
    connect_s: float = 5.0
    idle_s: float = 30.0

    @property
    def keepalive_s(self) -> float:
        return self.idle_s / 4


@dataclass
class PullRequest:
    token_ids: list[int]
    params: dict                 # the first token's sampling settings (SamplingParams fields)
    num_skip_blocks: int = 0     # leading blocks the decode side holds already: they are not sent
    traceparent: str | None = None   # the decode replica's request span (W3C): the prefill side's spans join its trace


class ExportStream(abc.ABC):
    """One transfer, prefill side. Called from the engine's thread."""

    @abc.abstractmethod
    def room(self) -> int:
        """Blocks it takes now (backpressure: the engine holds the rest in its cache until there is room)."""

    @abc.abstractmethod
    def send_block(self, index: int, block_id: int) -> None:
        """Queues block `block_id` of the cache as the prompt's block `index` (indices go up by one)."""

    @property
    @abc.abstractmethod
    def num_sent(self) -> int:
        """Blocks sent so far (the exporter may give them back to its cache)."""

    @abc.abstractmethod
    def finish(self, first_token: int) -> None:
        """After the last block: the first output token; the transfer then ends."""

    @abc.abstractmethod
    def fail(self, message: str) -> None:
        """Ends the transfer with an error the decode side reports."""

    @property
    @abc.abstractmethod
    def error(self) -> str | None:
        """Why the transfer broke from the transport's side (peer gone, stalled), or None."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """The transport is done with the stream and holds none of its blocks."""


class KVSource(abc.ABC):
    """Prefill side: the endpoint decode replicas pull from. `on_pull(request, stream)` is called on a transport
    thread for every accepted pull; `on_progress` whenever a stream sends, ends or breaks (the engine wakes)."""

    @abc.abstractmethod
    def start(self, on_pull: Callable[[PullRequest, ExportStream], None], on_progress: Callable[[], None]) -> None:
        ...

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """Where decode replicas reach it, `host:port`."""

    @abc.abstractmethod
    def close(self) -> None:
        ...


@dataclass
class PullHandle:
    """One transfer, decode side, as the engine watches it. `done` is set once the transport no longer touches the
    destination blocks: then either `first_token` or `error` is set."""
    done: threading.Event = field(default_factory=threading.Event)
    first_token: int | None = None
    error: Exception | None = None
    num_received: int = 0
    cancel: Callable[[], None] = lambda: None


class KVPuller(abc.ABC):
    """Decode side: starts pulls into the engine's cache; `block_ids[i]` receives the prompt's block
    `num_skip_blocks + i`. `on_done` is called (on a transport thread) when the handle is done."""

    @abc.abstractmethod
    def start(self, address: str, request: PullRequest, block_ids: list[int],
              on_done: Callable[[], None]) -> PullHandle:
        ...
