"""The scheduler's counters since start-up, the tokens a step computes per tenant, and how many drafts a sequence
gets next under speculation."""
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter

_tenant = attrgetter("params.tenant")


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    prefix_cache_queries: int = 0   # prompt tokens looked up at first admission
    prefix_cache_hits: int = 0      # of those, tokens served from the cache
    num_drafts: int = 0             # speculation: sequence-steps that carried draft tokens
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)   # accepted drafts by position 0..k-1

    def count_accepted(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1


def next_draft_limit(speculative_tokens: int, num_drafts: int, num_accepted: int) -> int:
    """How many drafts a sequence gets next: one past what it kept after a rejection, twice as many after a
    full acceptance (up to speculative_tokens). Wrong proposals then cost one extra query token per step,
    not k, where verifying is not free (a CPU, a full GPU batch); right ones soon get all k again."""
    if num_accepted == num_drafts:
        return min(speculative_tokens, 2 * num_drafts)
    return num_accepted + 1


class TenantTokens:
    """Tokens a scheduled batch computes for each tenant (prompt, output and draft tokens alike; "" is anonymous):
    the shares of its step's time (the per-tenant busy seconds, docs/server.md). It remembers the count of the
    last batch's decodes (one token each): in a run of decode steps the running set seldom changes, and telling
    that it did not costs about a microsecond at 256 sequences, against some 30 to count them again."""

    def __init__(self):
        self._decodes: list = []
        self._decode_counts: dict[str, int] = {}

    def count(self, batch) -> dict[str, int]:
        decodes = batch.num_decodes
        head = batch.seqs[:decodes]
        if head != self._decodes:   # compares identities first: the same sequences in the same order
            self._decodes, self._decode_counts = head, dict(Counter(map(_tenant, head)))
        counts = dict(self._decode_counts)
        for seq, num_new in zip(batch.seqs[decodes:], batch.num_new_tokens[decodes:]):
            counts[seq.params.tenant] = counts.get(seq.params.tenant, 0) + num_new
        return counts
