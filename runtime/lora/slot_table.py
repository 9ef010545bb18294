"""Which adapter each device slot holds and how many running sequences use it: rank 0's scheduler asks for a
slot when it admits a sequence of an adapter, and gives it back when the sequence finishes or is preempted.

An adapter is its name and its content digest (`Sequence.lora_id`): a name unloaded and loaded again from other
files is another adapter, never served from the slot its old weights are in. A slot is taken by an adapter
already in it; else by a free slot; else by the slot whose adapter no running sequence uses and that was used
least recently. When every slot is in use by running sequences of other adapters, the sequence waits (`admit`
says no). Each new placement is a load for every rank to apply before the step's forward (`take_loads`): its
slot, the adapter's name, folder and digest. Before a placement, `prepare` (rank 0's host cache) reads the adapter:
one whose files vanished or changed raises LoraError there, at admission, for its own request only, instead of
in the step's forward, where it would end the engine and every request in it.
"""
import itertools
from collections import Counter
from collections.abc import Callable


class LoraSlotTable:
    def __init__(self, max_loras: int, prepare: Callable[[str, str, str], object] | None = None):
        self.max_loras, self.prepare = max_loras, prepare
        self.slots: list[tuple[str, str] | None] = [None] * max_loras   # (name, digest) in each slot
        self.users: Counter[tuple[str, str]] = Counter()
        self.last_used: dict[int, int] = {}
        self.pending: list[tuple[int, str, str, str]] = []
        self._clock = itertools.count()

    @property
    def base_slot(self) -> int:
        """The slot id of the base model's tokens (outside the adapters' slots)."""
        return self.max_loras

    def admit(self, seq) -> bool:
        """Places the sequence's adapter (if any) in a slot and counts it as a user; False: no slot free now."""
        name = seq.params.lora_name
        if name is None:
            return True
        slot = self._slot_for((name, seq.lora_id), seq.lora_path)
        if slot is None:
            return False
        self.users[name, seq.lora_id] += 1
        self.last_used[slot] = next(self._clock)
        seq.lora_slot = slot
        return True

    def release(self, seq) -> None:
        if seq.lora_slot is None:
            return
        self.users[seq.params.lora_name, seq.lora_id] -= 1
        seq.lora_slot = None

    def take_loads(self) -> list[tuple[int, str, str, str]]:
        loads, self.pending = self.pending, []
        return loads

    def in_use(self) -> dict[str, int]:
        """Running sequences per adapter name."""
        counts: Counter[str] = Counter()
        for (name, _), count in self.users.items():
            counts[name] += count
        return {name: count for name, count in counts.items() if count > 0}

    def _slot_for(self, adapter: tuple[str, str], path: str) -> int | None:
        if adapter in self.slots:
            return self.slots.index(adapter)
        idle = [slot for slot, held in enumerate(self.slots) if held is None or self.users[held] == 0]
        if not idle:
            return None
        if self.prepare is not None:
            self.prepare(adapter[0], path, adapter[1])   # LoraError: the caller fails this sequence
        slot = min(idle, key=lambda s: (self.slots[s] is not None, self.last_used.get(s, -1)))
        self.slots[slot] = adapter
        self.pending.append((slot, adapter[0], path, adapter[1]))
        return slot
