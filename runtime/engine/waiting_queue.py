"""The scheduler's waiting queue, one class per `scheduling_policy`.

Every queue keeps preempted sequences ahead of new ones (they were admitted once already), and offers the same
operations: `add` a new sequence, `push_preempted`, `peek` / `pop` the next to admit, `remove`, and `charge`,
which the scheduler calls once a step with the tokens each tenant's sequences computed.

- `FcfsQueue`: arrival order.
- `ShortestFirstQueue`: by `queue_key` (arrival time plus the prompt's own prefill time; set by the scheduler).
- `FairQueue` (`fair`): strict priority classes (`SamplingParams.priority`, lower first); within a class, the
  tenant (`SamplingParams.tenant`) that was served the fewest tokens per unit of its weight goes next, first come
  first served within a tenant. This is the virtual token counter of Sheng et al., "Fairness in Serving Large
  Language Models" (OSDI 2024): a tenant's counter grows by the prompt and output tokens computed for it divided
  by its weight, and a tenant that comes back after a pause starts at the lowest counter of those waiting (and
  wins that tie once), so an idle tenant banks no credit. Tokens, not requests: a tenant with long prompts does not win by sending fewer.
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
    def __init__(self):
        self._classes: dict[int, dict[str, deque[Sequence]]] = {}   # priority -> tenant -> its waiting sequences
        self._preempted: dict[int, deque[Sequence]] = {}            # priority -> preempted, most recent first
        self.counters: dict[str, float] = {}                         # tenant -> tokens served / weight
        self._returned: set[str] = set()   # came back at the lowest waiting counter: first on a tie, once
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[Sequence]:
        """In the order they would be admitted if nothing changed."""
        for priority in sorted(set(self._classes) | set(self._preempted)):
            yield from self._preempted.get(priority, ())
            tenants = self._classes.get(priority, {})
            yield from sorted((seq for queue in tenants.values() for seq in queue),
                              key=lambda seq: (self.counters.get(seq.params.tenant, 0.0), seq.arrival_time))

    def add(self, seq: Sequence) -> None:
        tenant = seq.params.tenant
        tenants = self._classes.setdefault(seq.params.priority, {})
        if tenant not in tenants:   # back after a pause: no credit banked while it sent nothing
            waiting = [self.counters.get(t, 0.0) for queues in self._classes.values() for t in queues]
            lowest = min(waiting, default=0.0)
            if self.counters.get(tenant, 0.0) <= lowest:
                self.counters[tenant] = lowest
                self._returned.add(tenant)
            tenants[tenant] = deque()
        tenants[tenant].append(seq)
        self._length += 1

    def push_preempted(self, seq: Sequence) -> None:
        self._preempted.setdefault(seq.params.priority, deque()).appendleft(seq)
        self._length += 1

    def peek(self) -> Sequence:
        priority, tenant = self._next()
        return self._preempted[priority][0] if tenant is None else self._classes[priority][tenant][0]

    def pop(self) -> Sequence:
        priority, tenant = self._next()
        if tenant is None:
            queue, tenants = self._preempted[priority], self._preempted
            key = priority
        else:
            queue, tenants, key = self._classes[priority][tenant], self._classes[priority], tenant
            self._returned.discard(tenant)
        seq = queue.popleft()
        self._forget_empty(queue, tenants, key, priority)
        self._length -= 1
        return seq

    def remove(self, seq: Sequence) -> None:
        priority = seq.params.priority
        preempted = self._preempted.get(priority)
        if preempted is not None and seq in preempted:
            preempted.remove(seq)
            self._forget_empty(preempted, self._preempted, priority, priority)
        else:
            tenants = self._classes[priority]
            queue = tenants[seq.params.tenant]
            queue.remove(seq)
            self._forget_empty(queue, tenants, seq.params.tenant, priority)
        self._length -= 1

    def charge(self, seqs: list[Sequence], num_tokens: list[int]) -> None:
        counters = self.counters
        for seq, tokens in zip(seqs, num_tokens):
            params = seq.params
            counters[params.tenant] = counters.get(params.tenant, 0.0) + tokens / params.tenant_weight

    def most_urgent_priority(self) -> int | None:
        """The priority class of the next sequence to admit (None: nothing waits)."""
        return min(set(self._classes) | set(self._preempted), default=None)

    def _next(self) -> tuple[int, str | None]:
        """(priority, tenant) of the next sequence; tenant None: the class's preempted queue."""
        priority = self.most_urgent_priority()
        if priority is None:
            raise IndexError("the waiting queue is empty")
        if self._preempted.get(priority):
            return priority, None
        tenants = self._classes[priority]
        counters = self.counters
        returned = self._returned
        return priority, min(tenants, key=lambda t: (counters.get(t, 0.0), t not in returned, tenants[t][0].arrival_time))

    def _forget_empty(self, queue: deque, owner: dict, key, priority: int) -> None:
        if queue:
            return
        del owner[key]
        if owner is not self._preempted and not owner:
            del self._classes[priority]


def waiting_queue(policy: str):
    """The waiting queue of a `scheduling_policy`."""
    return {"fcfs": FcfsQueue, "shortest-first": ShortestFirstQueue, "fair": FairQueue}[policy]()
