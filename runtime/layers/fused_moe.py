"""The experts of a mixture-of-experts layer, held in the grouped layout the fused kernel reads.

`w13 [E, 2I, H]` holds each expert's gate rows then up rows, `w2 [E, H, I]` its down projection, loaded straight
from the checkpoint's per-expert tensors (`experts.N.gate_proj`, Mixtral's `experts.N.w1`...). Under tensor
parallelism every rank holds every expert with its intermediate size split, as a column-parallel gate/up and a
row-parallel down: the partial outputs are summed over the ranks.
"""
import torch
from torch import nn

from kubeinfer.kernels import ops
from kubeinfer.runtime.layers.linear import _copy_into, _read, _shape, load_rows
from kubeinfer.runtime.parallel import all_reduce, tp_rank, tp_size

# checkpoint projection name -> (our parameter, shard: 0 gate, 1 up, None down)
EXPERT_PROJECTIONS = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None),
                      "w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", None)}


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, renormalize: bool,
                 weights_in_fp32: bool = False):
        super().__init__()
        size = tp_size()
        assert intermediate_size % size == 0, \
            f"the experts' intermediate size {intermediate_size} does not split over {size} ranks"
        self.num_experts, self.top_k = num_experts, top_k
        self.renormalize, self.weights_in_fp32 = renormalize, weights_in_fp32
        self.intermediate = intermediate_size // size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.intermediate, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.intermediate), requires_grad=False)
        for param, shards in ((self.w13, [(e, s) for e in range(num_experts) for s in (0, 1)]),
                              (self.w2, [(e, None) for e in range(num_experts)])):
            param.weight_loader = self.weight_loader
            param.checkpoint_shards = shards   # what the loader expects to fill: each expert's tensors

    def weight_loader(self, param: nn.Parameter, source, shard: tuple[int, int | None]) -> None:
        expert, part = shard
        if part is not None:   # gate (0) or up (1): this rank's rows of the intermediate size
            size = self.intermediate
            rows = slice(tp_rank() * size, (tp_rank() + 1) * size)
            load_rows(param.data[expert, part * size:(part + 1) * size], source, rows, f"expert {expert} gate/up")
        elif _shape(source)[-1] == param.shape[-1]:   # down, one rank: whole
            load_rows(param.data[expert], source, None, f"expert {expert} down")
        else:   # down: this rank's columns
            cols = slice(tp_rank() * self.intermediate, (tp_rank() + 1) * self.intermediate)
            _copy_into(param.data[expert], _read(source, None, cols), f"expert {expert} down")

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = ops.moe_route(router_logits, self.top_k, self.renormalize, self.weights_in_fp32)
        return all_reduce(ops.fused_moe(x, self.w13, self.w2, weights, ids))
