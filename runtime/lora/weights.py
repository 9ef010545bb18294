"""The adapters of one rank: its model's LoRA slots, and a host cache of adapters read from their folders
(`max_cpu_loras` of them, least recently used dropped first). Every rank applies the same loads, decided by rank
0's slot table, before a step's forward. Only rank 0 reads folders: it read the adapter when the slot was taken
(slot_table's `prepare`, where a failure ends only that request), and it sends the weights to the other ranks in
the step, so a folder that vanishes or changes meanwhile cannot fail a tensor-parallel worker's step."""
from collections import OrderedDict

import torch
import torch.distributed as dist

from kubeinfer.runtime.lora.adapter import LoraAdapter, LoraError, load_adapter
from kubeinfer.runtime.lora.layers import attach_lora_slots
from kubeinfer.runtime.models.config import ModelConfig
from kubeinfer.runtime.parallel import world_rank, world_size


class LoraWeights:
    def __init__(self, model, model_config: ModelConfig, max_loras: int, max_rank: int, max_cpu_loras: int,
                 dtype: torch.dtype, device: torch.device):
        self.model_config, self.max_rank, self.max_cpu_loras = model_config, max_rank, max_cpu_loras
        self.layers = attach_lora_slots(model, max_loras, max(max_rank, 16), dtype, device)   # tl.dot: K >= 16
        self.cache: OrderedDict[str, LoraAdapter] = OrderedDict()

    def read(self, name: str, path: str, digest: str | None = None) -> LoraAdapter:
        """The adapter, from the cache or its folder (checked against the model: LoraError otherwise). `digest`: the
        content the engine loaded under this name: files changed in the folder since are refused, not served under
        KV keyed by the old content."""
        adapter = self.cache.get(name)
        if adapter is None or adapter.path != path or digest not in (None, adapter.digest):
            adapter = load_adapter(name, path, self.model_config, self.max_rank)
            if digest not in (None, adapter.digest):
                raise LoraError(f"adapter {name!r}: the files in {path} changed since it was loaded: load it again")
            self.cache[name] = adapter
            while len(self.cache) > self.max_cpu_loras:
                self.cache.popitem(last=False)
        self.cache.move_to_end(name)
        return adapter

    def forget(self, name: str) -> None:
        self.cache.pop(name, None)

    def apply(self, loads: list[tuple[int, str, str, str]]) -> None:
        """Every rank, in the same step: fills each load's slot (this rank's shard of it)."""
        for slot, name, path, digest in loads:
            by_layer: dict[int, dict] = {}
            for (layer, module), ab in self._weights(name, path, digest).items():
                by_layer.setdefault(layer, {})[module] = ab
            for layer, slots in self.layers.items():
                for lora_slots in slots:
                    lora_slots.set_slot(slot, by_layer.get(layer, {}))

    def _weights(self, name: str, path: str, digest: str) -> dict:
        """Rank 0's copy of the adapter's weights, on every rank (the others receive it and read no file)."""
        if world_size() == 1:
            return self.read(name, path, digest).weights
        box = [self.read(name, path, digest).weights if world_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]
