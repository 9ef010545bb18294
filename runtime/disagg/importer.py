"""The decode role, engine side: a request whose prompt's KV comes from a prefill replica.

`add(seq, source)` queues it (status RECEIVING: the scheduler does not see it). At each step's start (`admit()`,
engine thread), queued requests start their pull once the pool has blocks for the prompt and a running slot is
free: blocks its own prefix cache already holds are kept and not asked for; the others are allocated here and
filled by the transport as blocks arrive. A finished pull puts the request in the running set with the prompt
computed and the first token appended, exactly where a colocated prefill would have left it; from there it decodes
(and may be preempted and recomputed, or speculate) as any request. A failed or cancelled pull frees the blocks
once the transport has let go of them; a failure ends the request with its error (`take_failures`).
"""
import collections
import logging
import threading
import time
from dataclasses import dataclass

from kubeinfer.runtime.disagg.connector import KVPuller, PullHandle, PullRequest
from kubeinfer.runtime.disagg.exporter import first_token_settings
from kubeinfer.runtime.engine.messages import TokenDelta
from kubeinfer.runtime.engine.sequence import Sequence, SequenceStatus
from kubeinfer.runtime.errors import InvalidRequestError

logger = logging.getLogger(__name__)


@dataclass
class Import:
    seq: Sequence
    source: str
    handle: PullHandle | None = None
    cancelled: bool = False
    started: float = 0.0


def check_pullable(seq: Sequence) -> None:
    """What a pulled request cannot have (yet): the first token's logprobs, a grammar or an adapter are not sent."""
    params = seq.params
    for name, value in (("logprobs", params.logprobs), ("structured output", params.structured),
                        ("a LoRA adapter", params.lora_name)):
        if value is not None:
            raise InvalidRequestError(f"{name} cannot be combined with a KV transfer from a prefill replica yet")


class KVImporter:
    def __init__(self, core, puller: KVPuller, progress: threading.Event):
        self.core = core
        self.puller = puller
        self.block_manager = core.block_manager
        self.scheduler = core.scheduler
        self.queued: collections.deque[Import] = collections.deque()
        self.pulling: dict[str, Import] = {}
        self.progress = progress
        self.failures: list[tuple[str, str]] = []   # (request id, why) of requests whose transfer failed
        self.num_transferred = 0
        self.num_blocks_pulled = 0   # blocks received from prefill replicas
        self.num_blocks_reused = 0   # prompt blocks this replica's own prefix cache held (not asked for)
        self.num_failed = 0          # pulls that ended with an error (not those cancelled)

    def counts(self) -> dict[str, int]:
        return {"completed": self.num_transferred, "failed": self.num_failed, "blocks_pulled": self.num_blocks_pulled,
                "blocks_reused": self.num_blocks_reused, "in_flight": len(self.queued) + len(self.pulling)}

    @property
    def busy(self) -> bool:
        return bool(self.queued or self.pulling)

    def add(self, seq: Sequence, source: str) -> None:
        check_pullable(seq)
        seq.status = SequenceStatus.RECEIVING
        self.queued.append(Import(seq, source))

    def cancel(self, seq: Sequence) -> None:
        """Ends a receiving request (an abort): its blocks are freed once the transport has let go."""
        for item in self.queued:
            if item.seq is seq:
                self.queued.remove(item)
                break
        else:
            item = self.pulling[seq.request_id]
            item.cancelled = True
            item.handle.cancel()
        seq.status = SequenceStatus.FINISHED

    def take_failures(self) -> list[tuple[str, str]]:
        failures, self.failures = self.failures, []
        return failures

    def admit(self) -> list[TokenDelta]:
        """Ends the finished pulls (their requests start decoding with their first token) and starts queued ones."""
        deltas = []
        for request_id, item in list(self.pulling.items()):
            if not item.handle.done.is_set():
                continue
            del self.pulling[request_id]
            if item.cancelled or item.handle.error is not None:
                self.block_manager.free(item.seq)
                if not item.cancelled:
                    self._fail(item, str(item.handle.error))
                continue
            deltas.append(self._start_decoding(item))
        while self.queued and self._start_pull(self.queued[0]):
            self.queued.popleft()
        return deltas

    def _start_pull(self, item: Import) -> bool:
        seq, manager = item.seq, self.block_manager
        if len(self.scheduler.running) + len(self.pulling) >= self.scheduler.max_num_seqs:
            return False
        hits = manager.find_cached_blocks(seq)
        num_new = seq.num_tokens - len(hits) * manager.block_size
        # The watermark is kept while others run (as for a local request), so a prompt that fits the pool starts.
        if not manager.can_allocate(seq, hits, num_new, reserve=bool(self.scheduler.running or self.pulling)):
            return False
        manager.allocate(seq, hits, num_new)
        request = PullRequest(list(seq.token_ids), first_token_settings(seq.params), len(hits),
                              seq.params.trace_context)
        item.started = seq.scheduled_time = time.monotonic()
        item.handle = self.puller.start(item.source, request, seq.block_table[len(hits):], self.progress.set)
        self.pulling[seq.request_id] = item
        return True

    def _start_decoding(self, item: Import) -> TokenDelta:
        seq, scheduler, token = item.seq, self.scheduler, item.handle.first_token
        num_cached = seq.num_computed_tokens   # this replica's own prefix-cache hits, not pulled
        seq.num_cached_tokens = num_cached
        seq.num_computed_tokens = seq.num_prompt_tokens
        self.block_manager.cache_full_blocks(seq)
        scheduler.stats.prefix_cache_queries += seq.num_prompt_tokens
        scheduler.stats.prefix_cache_hits += num_cached
        seq.append_token(token)
        seq.first_token_time = time.monotonic()
        reason = scheduler.stop_reason(seq, token)
        stop_token = token if reason == "stop" and token in seq.params.stop_token_ids else None
        if reason is not None:
            scheduler.finish_one(seq, reason, stop_token)
            del self.core.seqs[seq.request_id]
        else:
            seq.status = SequenceStatus.RUNNING
            scheduler.running.append(seq)
        self.num_transferred += 1
        self.num_blocks_pulled += item.handle.num_received
        self.num_blocks_reused += num_cached // self.block_manager.block_size
        logger.debug("KV pull of %s from %s: %d blocks (%d cached here) in %.3f s", seq.request_id, item.source,
                     item.handle.num_received, num_cached // self.block_manager.block_size,
                     seq.first_token_time - item.started)
        return TokenDelta(seq.request_id, token, None, reason, stop_token, num_cached, seq.first_token_time,
                          seq.scheduled_time)

    def _fail(self, item: Import, message: str) -> None:
        seq = item.seq
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "error"
        self.core.seqs.pop(seq.request_id, None)
        self.failures.append((seq.request_id, message))
        self.num_failed += 1
        logger.warning("KV pull of %s from %s failed: %s", seq.request_id, item.source, message)
