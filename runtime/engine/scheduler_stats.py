"""The scheduler's counters since start-up, and how many drafts a sequence gets next under speculation."""
from dataclasses import dataclass, field


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
