"""The experts of a mixture-of-experts layer, held in the grouped layout the fused kernel reads.

`w13 [E, 2I, H]` holds each expert's gate rows then up rows, `w2 [E, H, I]` its down projection, loaded straight
from the checkpoint's per-expert tensors (`experts.N.gate_proj`, Mixtral's `experts.N.w1`...). Under tensor
parallelism every rank holds every expert with its intermediate size split, as a column-parallel gate/up and a
row-parallel down; under expert parallelism each of the group's N ranks holds `num_experts / N` whole experts and
computes their share for every token, whether attention is split over the same ranks or replicated on each.
Either way the partial outputs are summed over the ranks (the hidden states are already on every rank: no tokens
are sent, one all-reduce brings the sums back). Sending tokens to their experts' ranks (all-to-all) pays only when
each rank holds different tokens, i.e. data-parallel attention, which the runtime does not have.
"""
import torch
from torch import nn

from kubeinfer.kernels import ops
from kubeinfer.runtime.layers.linear import copy_into, read_slice, source_shape, load_rows
from kubeinfer.runtime.parallel import all_reduce, all_reduce_world, ep_rank, ep_size, tp_rank, tp_size

# checkpoint projection name -> (our parameter, shard: 0 gate, 1 up, None down)
EXPERT_PROJECTIONS = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None),
                      "w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", None)}


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, renormalize: bool,
                 weights_in_fp32: bool = False, expert_parallel: bool = False):
        super().__init__()
        size, rank = (ep_size(), ep_rank()) if expert_parallel else (tp_size(), tp_rank())
        self.num_experts, self.top_k = num_experts, top_k
        self.renormalize, self.weights_in_fp32 = renormalize, weights_in_fp32
        self.reduce = all_reduce_world if expert_parallel else all_reduce
        if expert_parallel:   # whole experts [first, first + local) on this rank
            assert num_experts % size == 0, f"{num_experts} experts do not split over {size} ranks"
            local, self.first_expert, self.width_split = num_experts // size, rank * (num_experts // size), 1
        else:                 # every expert, 1/size of its width
            assert intermediate_size % size == 0, \
                f"the experts' intermediate size {intermediate_size} does not split over {size} ranks"
            local, self.first_expert, self.width_split = num_experts, 0, size
        self.intermediate = intermediate_size // self.width_split
        self.w13 = nn.Parameter(torch.empty(local, 2 * self.intermediate, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(local, hidden_size, self.intermediate), requires_grad=False)
        # Tokens routed to each expert (all experts: every rank routes every token), for the load metrics.
        self.register_buffer("routed_tokens", torch.zeros(num_experts, dtype=torch.int64), persistent=False)
        experts = range(self.first_expert, self.first_expert + local)
        for param, shards in ((self.w13, [(e, s) for e in experts for s in (0, 1)]),
                              (self.w2, [(e, None) for e in experts])):
            param.weight_loader = self.weight_loader
            param.checkpoint_shards = shards   # what the loader expects to fill: this rank's experts' tensors

    def weight_loader(self, param: nn.Parameter, source, shard: tuple[int, int | None]) -> None:
        expert, part = shard
        local = expert - self.first_expert
        if not 0 <= local < param.shape[0]:   # another rank's expert: not read
            return
        # This rank's share of the width: all of it under expert parallelism.
        share = tp_rank() if self.width_split > 1 else 0
        if part is not None:   # gate (0) or up (1): rows of the intermediate size
            size = self.intermediate
            rows = slice(share * size, (share + 1) * size)
            load_rows(param.data[local, part * size:(part + 1) * size], source, rows, f"expert {expert} gate/up")
        elif source_shape(source)[-1] == param.shape[-1]:   # down, whole
            load_rows(param.data[local], source, None, f"expert {expert} down")
        else:   # down: this rank's columns
            cols = slice(share * self.intermediate, (share + 1) * self.intermediate)
            copy_into(param.data[local], read_slice(source, None, cols), f"expert {expert} down")

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = ops.moe_route(router_logits, self.top_k, self.renormalize, self.weights_in_fp32)
        flat = ids.flatten()
        self.routed_tokens.index_add_(0, flat, torch.ones_like(flat))   # no host sync: CUDA-graph safe
        return self.reduce(ops.fused_moe(x, self.w13, self.w2, weights, ids, self.first_expert))


def expert_load_summary(per_layer: list[list[int]]) -> tuple[tuple[int, ...], float]:
    """(tokens routed to each expert, summed over the layers; the worst layer's imbalance: its busiest expert's
    tokens over the mean, 1.0 when perfectly even, 0.0 before any token)."""
    per_expert = tuple(sum(column) for column in zip(*per_layer))
    imbalance = max((max(layer) * len(layer) / sum(layer) for layer in per_layer if sum(layer)), default=0.0)
    return per_expert, imbalance
