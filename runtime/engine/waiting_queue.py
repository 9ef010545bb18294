"""The scheduler's waiting queue, one class per `scheduling_policy`.

Preempted sequences go ahead of new ones (they were admitted once already; under `fair`, ahead of their own
tenant's), and every queue offers the same
operations: `add` a new sequence, `push_preempted`, `peek` / `pop` the next to admit, `remove`, and `charge`,
which the scheduler calls once a step with the tokens each tenant's sequences computed.

- `FcfsQueue`: arrival order.
- `ShortestFirstQueue`: by `queue_key` (arrival time plus the prompt's own prefill time; set by the scheduler).
- `FairQueue` (`fair`): strict priority classes (`SamplingParams.priority`, lower first); within a class, the
  tenant (`SamplingParams.tenant`) that was served the fewest tokens per unit of its weight goes next, its
  preempted sequences first, then first come first served. This is the virtual token counter of Sheng et al., "Fairness in Serving Large
  Language Models" (OSDI 2024): a tenant's counter grows by the prompt and output tokens computed for it divided
  by its weight. A tenant that comes back after a pause (nothing of it waiting) starts no lower than the lowest
  counter of those waiting less `credit` (one step's token budget), and wins a tie with it once: an idle tenant
  banks at most that credit. Without the credit (VTC's own rule, lifting to the lowest), a small tenant sending one
  request at a time came back level with the flooding tenant and its prompt put it ahead at once: its next request
  then waited until the flooding tenant had decoded as many tokens, ~0.5-1 s at 8 tokens a step
  (benchmarks/tenants.py). Tokens, not requests: a tenant with long prompts does not win by sending fewer.
"""
import bisect
from collections import deque
from collections.abc import Iterator
from operator import attrgetter

from kubeinfer.runtime.engine.sequence import Sequence

_queue_key = attrgetter("queue_key")


class FcfsQueue:
    def __init__(self):
        self._seqs: list[Sequence] = []   # preempted first, then arrivals in order

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._seqs)

    def add(self, seq: Sequence) -> None:
        self._seqs.append(seq)

    def push_preempted(self, seq: Sequence) -> None:
        self._seqs.insert(0, seq)

    def peek(self) -> Sequence:
        return self._seqs[0]

    def pop(self) -> Sequence:
        return self._seqs.pop(0)

    def remove(self, seq: Sequence) -> None:
        self._seqs.remove(seq)

    def charge(self, seqs: list[Sequence], num_tokens: list[int]) -> None:
        """Tokens computed this step, per sequence: only the fair queue counts them."""


class ShortestFirstQueue(FcfsQueue):
    def add(self, seq: Sequence) -> None:
        bisect.insort(self._seqs, seq, key=_queue_key)   # preempted ones have key -inf: they stay ahead


class FairQueue:
    """Preempted sequences go back to the front of their own tenant's queue (not ahead of other tenants: a
    sequence preempted to make room for another tenant must not take that room back at once)."""

    def __init__(self, credit: float = 0.0):
        self.credit = credit
        self._classes: dict[int, dict[str, deque[Sequence]]] = {}   # priority -> tenant -> its waiting sequences
        self.counters: dict[str, float] = {}                         # tenant -> tokens served / weight
        self._returned: set[str] = set()   # came back at the lowest waiting counter: first on a tie, once
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[Sequence]:
        """In the order they would be admitted if nothing changed."""
        for priority in sorted(self._classes):
            queues = self._classes[priority]
            order = sorted(queues, key=lambda t: self._rank(t, queues))
            yield from (seq for tenant in order for seq in queues[tenant])

    def add(self, seq: Sequence) -> None:
        tenant = seq.params.tenant
        tenants = self._classes.setdefault(seq.params.priority, {})
        if tenant not in tenants:   # back after a pause: no more than `credit` banked while it sent nothing
            waiting = [self.counters.get(t, 0.0) for queues in self._classes.values() for t in queues]
            lowest = min(waiting, default=0.0)
            own = self.counters.get(tenant, 0.0)
            if own <= lowest:
                self.counters[tenant] = max(own, lowest - self.credit)
                self._returned.add(tenant)
            tenants[tenant] = deque()
        tenants[tenant].append(seq)
        self._length += 1

    def push_preempted(self, seq: Sequence) -> None:
        self._classes.setdefault(seq.params.priority, {}).setdefault(seq.params.tenant, deque()).appendleft(seq)
        self._length += 1

    def peek(self) -> Sequence:
        priority, tenant = self._next()
        return self._classes[priority][tenant][0]

    def pop(self) -> Sequence:
        priority, tenant = self._next()
        self._returned.discard(tenant)
        return self._take(priority, tenant, None)

    def remove(self, seq: Sequence) -> None:
        self._take(seq.params.priority, seq.params.tenant, seq)

    def charge(self, seqs: list[Sequence], num_tokens: list[int]) -> None:
        """Counts the tokens each sequence computes this step, except those it computes again after a preemption
        (the tenant was charged for them once; recomputing them was the scheduler's choice)."""
        counters = self.counters
        for seq, tokens in zip(seqs, num_tokens):
            end = seq.num_computed_tokens + tokens
            new = end - max(seq.num_computed_tokens, seq.num_charged_tokens)
            if new > 0:
                params = seq.params
                counters[params.tenant] = counters.get(params.tenant, 0.0) + new / params.tenant_weight
                seq.num_charged_tokens = end

    def tenant_weights(self, priority: int) -> dict[str, float]:
        """The weight of each tenant of class `priority` that has sequences waiting."""
        return {tenant: queue[0].params.tenant_weight for tenant, queue in self._classes.get(priority, {}).items()}

    def _rank(self, tenant: str, queues: dict[str, deque[Sequence]]) -> tuple:
        """Fewest tokens per weight first; on a tie, a tenant that just came back, then the oldest head."""
        return self.counters.get(tenant, 0.0), tenant not in self._returned, queues[tenant][0].arrival_time

    def _next(self) -> tuple[int, str]:
        """(priority, tenant) of the next sequence to admit."""
        if not self._classes:
            raise IndexError("the waiting queue is empty")
        priority = min(self._classes)
        queues = self._classes[priority]
        return priority, min(queues, key=lambda t: self._rank(t, queues))

    def _take(self, priority: int, tenant: str, seq: Sequence | None) -> Sequence:
        """Takes `seq` (None: the head) out of its tenant's queue, dropping queues and classes left empty."""
        queues = self._classes[priority]
        queue = queues[tenant]
        if seq is None:
            seq = queue.popleft()
        else:
            queue.remove(seq)
        if not queue:
            del queues[tenant]
            if not queues:
                del self._classes[priority]
        self._length -= 1
        return seq


def waiting_queue(policy: str, fair_credit: float = 0.0):
    """The waiting queue of a `scheduling_policy` (`fair_credit`: the fair queue's `credit`, in tokens)."""
    if policy == "fair":
        return FairQueue(fair_credit)
    return {"fcfs": FcfsQueue, "shortest-first": ShortestFirstQueue}[policy]()
