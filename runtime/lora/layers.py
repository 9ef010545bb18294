"""The device slots of one linear layer: up to `max_loras` adapters' A and B, stacked so that one batched
product (kernels `ops.lora_delta`) adds every token's own adapter.

A fused layer (QKV, gate/up) holds each part's A in its own rows of the slot's A (`[parts * R, in]`) and each
part's B in its own output rows and columns of the slot's B (block diagonal, `[out, parts * R]`). Shards follow the
base layer: a column-parallel layer splits B's rows as it splits its outputs (A whole); a row-parallel one splits
A's columns as it splits its inputs (B whole), and its partial products are summed by the layer's own all-reduce.
"""
import torch

from kubeinfer.kernels import ops
from kubeinfer.runtime.context import lora_batch
from kubeinfer.runtime.parallel import tp_rank, tp_size


class LoraSlots:
    def __init__(self, parts: list[tuple[str, int, int, int]], in_features: int, out_features: int,
                 row_parallel: bool, max_loras: int, max_rank: int, dtype: torch.dtype, device: torch.device):
        """`parts`: (module, first output row of this rank's shard within the layer, rows in it, first row of the
        shard in the module's full output)."""
        self.parts, self.row_parallel, self.max_rank = parts, row_parallel, max_rank
        self.blocks = [(start, rows) for _, start, rows, _ in parts] if len(parts) > 1 else None
        rank_rows = len(parts) * max_rank
        self.lora_a = torch.zeros(max_loras, rank_rows, in_features, dtype=dtype, device=device)
        self.lora_b = torch.zeros(max_loras, out_features, rank_rows, dtype=dtype, device=device)

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Fills `slot` with an adapter's (A, scaled B) per module of this layer (modules it lacks stay zero)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        in_local = self.lora_a.shape[2]
        for index, (module, out_start, out_rows, full_start) in enumerate(self.parts):
            if module not in weights:
                continue
            a, b = weights[module]
            rank, cols = a.shape[0], slice(index * self.max_rank, index * self.max_rank + a.shape[0])
            if self.row_parallel:
                a = a[:, tp_rank() * in_local:(tp_rank() + 1) * in_local]
            self.lora_a[slot, cols] = a.to(self.lora_a.dtype)
            self.lora_b[slot, out_start:out_start + out_rows, cols] = \
                b[full_start:full_start + out_rows, :rank].to(self.lora_b.dtype)

    def add_to(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out` plus each token's adapter update, when this forward carries adapters."""
        batch = lora_batch()
        if batch is None:
            return out
        slot_ids, plan = batch
        flat = out.view(-1, out.shape[-1])
        return ops.lora_add(flat, x.reshape(-1, x.shape[-1]), self.lora_a, self.lora_b, slot_ids, plan,
                            self.blocks).view_as(out)


def lora_parts(layer, name: str) -> tuple[list[tuple[str, int, int, int]], bool]:
    """The adapter modules a base linear layer of a Llama-family model carries, with their shard rows, and whether
    it is row-parallel. `name`: a row-parallel layer's module (o_proj or down_proj)."""
    from kubeinfer.runtime.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    if isinstance(layer, QKVParallelLinear):
        q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        kv_start = (tp_rank() // layer.kv_replicas) * kv
        return [("q_proj", 0, q, tp_rank() * q), ("k_proj", q, kv, kv_start), ("v_proj", q + kv, kv, kv_start)], False
    if isinstance(layer, MergedColumnParallelLinear):
        size = layer.output_sizes[0] // tp_size()
        return [("gate_proj", 0, size, tp_rank() * size), ("up_proj", size, size, tp_rank() * size)], False
    assert isinstance(layer, RowParallelLinear), f"adapters do not target a {type(layer).__name__}"
    return [(name, 0, layer.out_features, 0)], True


def attach_lora_slots(model, max_loras: int, max_rank: int, dtype: torch.dtype,
                      device: torch.device) -> dict[int, list[LoraSlots]]:
    """Gives every attention and dense MLP projection of `model` its slots; per decoder layer, the slots."""
    per_layer: dict[int, list[LoraSlots]] = {}
    for index, decoder in enumerate(model.model.layers):
        attention, mlp = decoder.self_attn, decoder.mlp
        layers = [(attention.qkv_proj, "qkv"), (attention.o_proj, "o_proj")]
        if hasattr(mlp, "gate_up_proj"):   # a dense MLP (an MoE layer's experts are not targeted)
            layers += [(mlp.gate_up_proj, "gate_up"), (mlp.down_proj, "down_proj")]
        for layer, name in layers:
            parts, row_parallel = lora_parts(layer, name)
            layer.lora = LoraSlots(parts, layer.in_features, layer.out_features, row_parallel, max_loras, max_rank,
                                   dtype, device)
            per_layer.setdefault(index, []).append(layer.lora)
    return per_layer
