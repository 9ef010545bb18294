"""Under the `fair` policy: how many prompt tokens one step gives a tenant that fills its share of the engine.

A request waits for the step in flight when it arrives. Under a flood, every step carried the flooding tenant's
prompt chunks up to the whole budget (1,300-1,800 tokens, 130-190 ms on the 2-vCPU box), so another tenant's first
token waited for such a step, then for its own (benchmarks/tenants.py: B's P95 1.6x its solo P95, where its own
step is ~70 ms). A tenant with at least its weighted share of the running set in the engine, running or waiting
(`max_num_seqs` x its weight / the weights of the tenants running or waiting, all classes) is capped: all capped
tenants' prompt tokens together take at most `budget / PROMPT_SHARE_DIVISOR` of a step (shared out in the order
the scheduler meets them, which the fair queue decided when it admitted them: a cap per tenant would undo the
weights), so the steps they fill stay short. A tenant below its share (a small one arriving) is not capped, so
its own prompt is computed in one step. Decode tokens are never capped.

The price: a tenant alone with more requests than the running set holds computes its prompts in quarter-budget
chunks, more steps for the same tokens (benchmarks/tenants.py reports A's tokens/s under `fair` beside `fcfs`).
"""
from collections import Counter

from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.engine.waiting_queue import FairQueue

PROMPT_SHARE_DIVISOR = 4


class PromptCaps:
    """The prompt tokens each capped tenant may still take this step; counted lazily (a step of decodes only
    never counts the tenants)."""

    def __init__(self, running: list[Sequence], waiting: FairQueue, max_num_seqs: int, budget: int):
        self._running, self._waiting = running, waiting
        self._max_num_seqs, self._cap = max_num_seqs, max(1, budget // PROMPT_SHARE_DIVISOR)
        self._capped: set[str] | None = None
        self._left = self._cap

    def allow(self, seq: Sequence, num_new: int) -> int:
        """How many of `num_new` prompt tokens `seq` may take now (0: none this step)."""
        if self._capped is None:
            self._capped = at_share(self._running, self._waiting.tenant_backlogs(), self._max_num_seqs)
        return min(num_new, self._left) if seq.params.tenant in self._capped else num_new

    def take(self, seq: Sequence, num_new: int) -> None:
        """Counts `num_new` prompt tokens of `seq` scheduled this step."""
        if self._capped is not None and seq.params.tenant in self._capped:
            self._left -= num_new


def at_share(running: list[Sequence], backlogs: dict[str, tuple[float, int]], max_num_seqs: int) -> set[str]:
    """The tenants with at least their weighted share of `max_num_seqs` slots in the engine, running or waiting
    (`backlogs`: each waiting tenant's weight and sequences waiting)."""
    held = Counter(seq.params.tenant for seq in running)
    weights = {tenant: weight for tenant, (weight, _) in backlogs.items()}
    for seq in running:
        weights[seq.params.tenant] = seq.params.tenant_weight
    for tenant, (_, waiting) in backlogs.items():
        held[tenant] += waiting
    total = sum(weights.values())
    return {tenant for tenant, count in held.items() if count * total >= max_num_seqs * weights[tenant]}
