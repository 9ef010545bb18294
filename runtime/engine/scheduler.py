"""Continuous batching with chunked prefill: decides which tokens of which sequences run each step.

Policy, per step, within `max_num_batched_tokens`:
1. Running sequences first, oldest first: a decoding sequence takes 1 token, one still in prefill takes
   the next chunk of its prompt (as much as the budget leaves). When the KV pool cannot hold a sequence's
   next tokens, the newest running sequence is preempted: its blocks are freed (they stay in the prefix
   cache) and it goes back to the front of the waiting queue, to be recomputed later.
2. Then waiting sequences, in arrival order, while the budget, `max_num_seqs` and the pool allow; none are
   admitted in a step that preempted. A waiting sequence starts after its prefix-cache hits.
A sequence is sampled in the step that computes its last known token.
"""
from collections import deque
from dataclasses import dataclass, field

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    prefix_cache_queries: int = 0   # prompt tokens looked up at first admission
    prefix_cache_hits: int = 0      # of those, tokens served from the cache


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...]):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch:
        batch, budget, preempted = ScheduledBatch(), self.max_num_batched_tokens, False
        block_manager, running = self.block_manager, self.running
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not block_manager.can_append(seq, num_new):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                block_manager.append(seq, num_new)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(num_new)
                budget -= num_new
                index += 1
        while self.waiting and budget > 0 and len(running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            hits = block_manager.find_cached_blocks(seq)
            num_new = min(seq.num_tokens - len(hits) * block_manager.block_size, budget)
            if not block_manager.can_allocate(seq, hits, num_new, reserve=bool(running)):
                break
            self.waiting.popleft()
            block_manager.allocate(seq, hits, num_new)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
                self.stats.prefix_cache_queries += seq.num_prompt_tokens
                self.stats.prefix_cache_hits += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(seq)

    def postprocess(self, batch: ScheduledBatch, sampled: list[int | None]) -> None:
        """Records the computed tokens and the sampled ones; finishes sequences at EOS, a stop id or a limit."""
        finished = False
        for seq, num_new, token in zip(batch.seqs, batch.num_new_tokens, sampled):
            seq.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(seq)
            if token is None:   # a prefill chunk that did not reach the end of the prompt
                continue
            seq.append_token(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason, token if token in seq.params.stop_token_ids else None)
                finished = True
        if finished:
            self.running = [seq for seq in self.running if not seq.is_finished]

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if token in self.eos_token_ids and not params.ignore_eos:
                return "stop"
            if token in params.stop_token_ids:
                return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self.block_manager.free(seq)

    def finish(self, seqs: list[Sequence], reason: str) -> None:
        """Finishes sequences from outside a step (stop strings, aborts), wherever they are queued."""
        for seq in seqs:
            if seq.is_finished:
                continue
            if seq.status is SequenceStatus.WAITING:
                self.waiting.remove(seq)
            self._finish(seq, reason, seq.stop_reason)
        self.running = [seq for seq in self.running if not seq.is_finished]
