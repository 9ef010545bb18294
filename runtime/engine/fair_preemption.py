"""Under the `fair` policy: which running sequence gives way to the waiting one that cannot start.

The waiting queue decides who goes next (waiting_queue.FairQueue); this decides whether that sequence may take
the place of a running one rather than wait for one to end. Without it a small tenant's request would wait
behind a big tenant's running set for a sequence to finish, however far below its share it is: one of its
requests still decoding was enough to make the next one wait ~0.5 s under a 10x flood (benchmarks/tenants.py).

In order:
1. A lower priority class gives way first, the newest of the lowest class (unless `priority_preemption` is off).
2. Within its class, a tenant holding fewer of the running set's slots than its weighted share
   (`max_num_seqs` x its weight / the weights of the class's tenants, running or waiting), or none at all,
   takes the place of the newest sequence of the tenant that is furthest ahead of it in tokens per weight,
   among tenants that hold more than their own share (with none at all: any tenant ahead of it). Shares are
   slots, the queue's order is tokens: a tenant is preempted only when it is both ahead in tokens and over its
   slots, so a tenant never loses a sequence to one that has been served more.
A preempted sequence keeps its blocks in the prefix cache, so its recompute mostly hits the cache.
"""
from collections import Counter

from kubeinfer.runtime.engine.sequence import Sequence


def victim_for(seq: Sequence, running: list[Sequence], counters: dict[str, float],
               waiting_weights: dict[str, float], max_num_seqs: int, priority_preemption: bool) -> int | None:
    """The index in `running` of the sequence that gives way to `seq`, or None (it waits).
    `counters`: tokens served per weight, per tenant; `waiting_weights`: the weight of each tenant of `seq`'s
    class with sequences waiting."""
    params = seq.params
    priority, tenant, weight = params.priority, params.tenant, params.tenant_weight
    if priority_preemption:
        lower = [i for i, other in enumerate(running) if other.params.priority > priority]
        if lower:
            return max(lower, key=lambda i: (running[i].params.priority, i))
    held_own = sum(1 for other in running if other.params.tenant == tenant and other.params.priority == priority)
    waiting_others = sum(w for t, w in waiting_weights.items() if t != tenant)
    if held_own and held_own >= max_num_seqs * weight / (weight + waiting_others):
        return None   # at its share even if no tenant but the waiting ones ran: the common case, one pass
    peers = [i for i, other in enumerate(running) if other.params.priority == priority]
    held = Counter(running[i].params.tenant for i in peers)
    weights = dict(waiting_weights)
    for i in peers:
        weights[running[i].params.tenant] = running[i].params.tenant_weight
    weights[tenant] = weight
    slots_per_weight = max_num_seqs / sum(weights.values())
    starved = held_own == 0
    if not starved and held_own >= weight * slots_per_weight:
        return None
    own = counters.get(tenant, 0.0)
    ahead = [i for i in peers if (other := running[i].params.tenant) != tenant and counters.get(other, 0.0) >= own
             and (starved or held[other] > weights[other] * slots_per_weight)]
    return max(ahead, key=lambda i: (counters.get(running[i].params.tenant, 0.0), i)) if ahead else None
