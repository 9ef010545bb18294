"""Continuous batching with chunked prefill: decides which tokens of which sequences run each step.

Policy, per step, within `max_num_batched_tokens`:
1. Running sequences first, oldest first: a decoding sequence takes 1 token, one still in prefill takes
   the next chunk of its prompt (as much as the budget leaves). When the KV pool cannot hold a sequence's
   next tokens, the newest running sequence is preempted: its blocks are freed (they stay in the prefix
   cache) and it goes back to the front of the waiting queue, to be recomputed later.
2. Then waiting sequences, in queue order, while the budget, `max_num_seqs` and the pool allow; none are
   admitted in a step that preempted. A waiting sequence starts after its prefix-cache hits.
The queue order (`scheduling_policy`): preempted sequences first, then
- `fcfs` (the default): arrival order.
- `shortest-first`: by arrival time plus the prompt's own prefill time at the engine's measured
  prefill rate (`observe_step`). Requests that arrive together start shortest first, which lowers the median
  time to first token of a burst (the burst as a whole may take a few percent longer: short prompts decode
  beside the longer ones' prefill; benchmarks/burst_ttft.py). A prompt is passed only by shorter ones that
  arrive within its own prefill time after it (no starvation: whatever arrives later queues behind it).
  Until a step is measured, a full step is assumed to take 10 ms. Not the default: under sustained load a
  prompt's extra wait is the work of what passes it, which can exceed that window, and the key counts a
  prompt's prefix-cached tokens as if they were to be computed (docs/runtime.md: the router's load test had
  a higher TTFT P95 with it).
- `fair`: strict priority classes, then a weighted fair share of computed tokens between tenants (API keys);
  a waiting sequence that cannot start preempts running ones of lower classes (unless `priority_preemption` is
  off: it then waits for room, still ahead of them), and, when its tenant holds less than its weighted share of
  the running set, one of the tenant of its class furthest ahead of it (runtime/engine/waiting_queue.py,
  runtime/engine/fair_preemption.py).
A sequence is sampled in the step that computes its last known token.

Speculative decoding (`speculative_method`): a decoding sequence may also carry draft tokens, proposed here
and verified by the same forward; they take budget and KV slots like any token. Drafts never cause a
preemption: a sequence that cannot fit its drafts runs without them. How many a sequence gets adapts to what
it kept last time (`scheduler_stats.next_draft_limit`). After the step, the computed tokens are the last known one and the
accepted drafts; the slots written for rejected drafts lie beyond them and are overwritten later, and a block
grown for them stays the sequence's (freed with it).
"""
import math
import time
from dataclasses import dataclass, field

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.bulk_decode import postprocess_decodes, schedule_decodes
from kubeinfer.runtime.engine.fair_preemption import victim_for
from kubeinfer.runtime.engine.ngram_proposer import propose_ngram
from kubeinfer.runtime.engine.scheduler_stats import SchedulerStats, next_draft_limit
from kubeinfer.runtime.engine.sequence import Sequence, SequenceStatus
from kubeinfer.runtime.engine.waiting_queue import waiting_queue
from kubeinfer.runtime.lora.adapter import LoraError
from kubeinfer.runtime.lora.slot_table import LoraSlotTable

PREFILL_RATE_SMOOTHING = 0.2   # weight of the newest step in the prefill rate's moving average
ASSUMED_FULL_STEP_SECONDS = 0.01   # until a step is measured: a fast engine's (near arrival order, but shortest
                                   # first among requests that arrive within milliseconds of each other)


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0   # the first seqs, each computing its one last token with no drafts (the fast paths')
    lora_loads: list[tuple[int, str, str, str]] = field(default_factory=list)   # adapters to put in slots first

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_token_ids: tuple[int, ...],
                 max_model_len: int):
        """`max_model_len`: the longest sequence the engine serves (`ModelRunner.max_model_len`)."""
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = max_model_len
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        self.speculative_method = config.speculative_method
        self.speculative_tokens = config.speculative_tokens
        self.ngram_range = (config.speculative_ngram_min, config.speculative_ngram_max)
        self.shortest_first = config.scheduling_policy == "shortest-first"
        self.fair = config.scheduling_policy == "fair"
        self.priority_preemption = config.priority_preemption
        self.prefill_rate: float | None = None   # tokens/s of steps of at least half the budget (observe_step)
        self.waiting = waiting_queue(config.scheduling_policy, fair_credit=config.max_num_batched_tokens)
        self.running: list[Sequence] = []
        self.stats = SchedulerStats(accepted_per_position=[0] * config.speculative_tokens)
        self.bulk_decodes = True   # the bulk path of all-decode steps (runtime/engine/bulk_decode.py)
        self.loras = LoraSlotTable(config.max_loras)   # adapters in device slots; a running sequence holds its own
        self.failed: list[tuple[Sequence, str]] = []     # ended at admission, with why (take_failed)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        if self.shortest_first:
            rate = self.prefill_rate or self.max_num_batched_tokens / ASSUMED_FULL_STEP_SECONDS
            seq.queue_key = seq.arrival_time + seq.num_tokens / rate
        self.waiting.add(seq)

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """Learns the prefill rate (shortest-first's aging) from a step's forward; only steps of at least half the
        budget count (decode steps say little about how fast prompts are computed). fcfs needs no rate."""
        if not self.shortest_first or 2 * num_tokens < self.max_num_batched_tokens or seconds <= 0:
            return
        rate = num_tokens / seconds
        if self.prefill_rate is None:
            self.prefill_rate = rate
        else:
            self.prefill_rate += PREFILL_RATE_SMOOTHING * (rate - self.prefill_rate)

    def schedule(self) -> ScheduledBatch:
        batch, budget, preempted, deferred = ScheduledBatch(), self.max_num_batched_tokens, False, []
        block_manager, running = self.block_manager, self.running
        # Under `fair`, a sequence that running ones gave way to starts in a step without other tenants' prompt
        # chunks (they wait one step): its first token then comes after its own prefill and the decodes only.
        head = self.waiting.peek() if self.fair and self.waiting else None
        favoured = head.params.tenant if head is not None and self._make_room_for(head) else None
        index = schedule_decodes(self, batch) if self.bulk_decodes else 0
        budget -= index
        while index < len(running) and budget > 0:
            seq = running[index]
            if favoured is not None and seq.num_uncomputed_tokens > 1 and seq.params.tenant != favoured:
                index += 1
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if self.speculative_method is not None and num_new == seq.num_uncomputed_tokens == 1:
                seq.draft_token_ids = self._propose(seq, budget - 1)
                if not block_manager.can_append(seq, 1 + len(seq.draft_token_ids)):
                    seq.draft_token_ids = []
                num_new += len(seq.draft_token_ids)
            while not block_manager.can_append(seq, num_new):
                victim = self._pop_victim()
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
            seq = self.waiting.peek()
            hits = block_manager.find_cached_blocks(seq)
            num_new = min(seq.num_tokens - len(hits) * block_manager.block_size, budget)
            if not block_manager.can_allocate(seq, hits, num_new, reserve=bool(running)):
                break
            self.waiting.pop()
            try:
                admitted = not (deferred and seq.params.lora_name is not None) and self.loras.admit(seq)
            except LoraError as error:   # its adapter cannot be read (files gone or changed): it alone ends
                self.finish_one(seq, "error")
                self.failed.append((seq, str(error)))
                continue
            if not admitted:
                deferred.append(seq)   # no adapter slot free: base-model requests behind it go first, adapters wait
                continue
            block_manager.allocate(seq, hits, num_new)
            if seq.num_preemptions == 0:
                # A resumed request looks up its output so far too; only the prompt's hits are its cached tokens.
                seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
                self.stats.prefix_cache_queries += seq.num_tokens
                self.stats.prefix_cache_hits += seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            if seq.scheduled_time is None:
                seq.scheduled_time = time.monotonic()
            running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        for seq in reversed(deferred):   # back at the head, in their order
            self.waiting.push_preempted(seq)
        self.waiting.charge(batch.seqs, batch.num_new_tokens)
        batch.lora_loads = self.loras.take_loads()
        return batch

    def _pop_victim(self) -> Sequence:
        """The running sequence to preempt: the newest; under `fair`, the newest of the lowest class."""
        running = self.running
        if not self.fair:
            return running.pop()
        index = max(range(len(running)), key=lambda i: (running[i].params.priority, i))
        return running.pop(index)

    def _make_room_for(self, seq: Sequence) -> bool:
        """Under `fair`: when the next waiting sequence cannot start (no KV blocks for its first chunk, or no room
        in the running set), running sequences give way to it as runtime/engine/fair_preemption.py decides. They
        are recomputed later, as any preempted sequence. Whether any gave way."""
        block_manager, running = self.block_manager, self.running
        hits = block_manager.find_cached_blocks(seq)   # preemptions free blocks but cache nothing new
        num_new = min(seq.num_tokens - len(hits) * block_manager.block_size, self.max_num_batched_tokens)
        weights, gave_way = None, False
        while running:
            if len(running) < self.max_num_seqs and block_manager.can_allocate(seq, hits, num_new, reserve=True):
                return gave_way
            if weights is None:
                weights = self.waiting.tenant_weights(seq.params.priority)
            victim = victim_for(seq, running, self.waiting.counters, weights, self.max_num_seqs,
                                self.priority_preemption)
            if victim is None:
                return gave_way
            self._preempt(running.pop(victim))
            gave_way = True
        return gave_way

    def _propose(self, seq: Sequence, room: int) -> list[int]:
        """Draft tokens for a decoding sequence: no more than `room` (the step's budget), the tokens it may
        still output after this step's own, or the positions left before max_model_len."""
        limit = min(seq.draft_limit or self.speculative_tokens, room,
                    seq.params.max_tokens - seq.num_output_tokens - 1, self.max_model_len - seq.num_tokens)
        if limit < 1:
            return []
        if self.speculative_method == "draft":   # slots reserved; the draft model fills them before the forward
            return [-1] * limit
        return propose_ngram(seq.token_ids, limit, *self.ngram_range)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.loras.release(seq)
        seq.status = SequenceStatus.WAITING
        seq.draft_token_ids = []
        seq.num_draft_computed = 0
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.queue_key = -math.inf   # shortest-first's insort then keeps every arrival behind it
        self.stats.num_preemptions += 1
        self.waiting.push_preempted(seq)

    def postprocess(self, batch: ScheduledBatch, sampled: list[list[int]]) -> list[list[int]]:
        """Records the computed tokens and the sampled ones (several where drafts were accepted); finishes
        sequences at EOS, a stop id or a limit. Returns the tokens each sequence kept: those after the one
        that finished it are dropped."""
        kept_all, finished = postprocess_decodes(self, batch, sampled)
        num_decodes = batch.num_decodes
        for seq, num_new, tokens in zip(batch.seqs[num_decodes:], batch.num_new_tokens[num_decodes:],
                                        sampled[num_decodes:]):
            drafts = seq.draft_token_ids
            if drafts:
                seq.draft_token_ids = []
                self.stats.count_accepted(len(drafts), len(tokens) - 1)
                seq.draft_limit = next_draft_limit(self.speculative_tokens, len(drafts), len(tokens) - 1)
                num_new -= len(drafts) - (len(tokens) - 1)   # rejected drafts' slots are not computed
            kept, reason = [], None
            for token in tokens:
                seq.append_token(token)
                kept.append(token)
                reason = self.stop_reason(seq, token)
                if reason is not None:
                    break
            # Capped: when a token ended the sequence, the accepted drafts after it are not its tokens.
            seq.num_computed_tokens = min(seq.num_computed_tokens + num_new, seq.num_tokens)
            seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
            self.block_manager.cache_full_blocks(seq)
            if reason is not None:
                self.finish_one(seq, reason, kept[-1] if kept[-1] in seq.params.stop_token_ids else None)
                finished = True
            kept_all.append(kept)
        if finished:
            self.running = [seq for seq in self.running if not seq.is_finished]
        return kept_all

    def stop_reason(self, seq: Sequence, token: int) -> str | None:
        """Why `token`, just appended, ends `seq` ("stop" or "length"), or None."""
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if token in self.eos_token_ids and not params.ignore_eos:
                return "stop"
            if token in params.stop_token_ids:
                return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def take_failed(self) -> list[tuple[Sequence, str]]:
        """Sequences that ended at admission with an error since the last call, with the error's words."""
        failed, self.failed = self.failed, []
        return failed

    def finish_one(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        """Ends `seq` inside a step (its blocks go back to the pool; `running` is filtered by the caller)."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self.block_manager.free(seq)
        self.loras.release(seq)

    def finish(self, seqs: list[Sequence], reason: str) -> None:
        """Finishes sequences from outside a step (stop strings, aborts), wherever they are queued."""
        for seq in seqs:
            if seq.is_finished:
                continue
            if seq.status is SequenceStatus.WAITING:
                self.waiting.remove(seq)
            self.finish_one(seq, reason, seq.stop_reason)
        self.running = [seq for seq in self.running if not seq.is_finished]
