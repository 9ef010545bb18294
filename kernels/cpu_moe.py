"""The experts of a mixture-of-experts layer on the CPU: `references.fused_moe`'s loop over the active experts,
with what the CPU does slowly taken out.

- Each expert's rows are written to their (token, k) pair's row of a `[T*k, H]` buffer (`index_copy_`: the pairs
  of one expert are distinct rows) instead of `index_add_` into the output, which on the CPU took 20% of an MoE
  model's step; a token's k rows are then added in ascending expert order, the order the reference (and
  transformers) adds them in, so fp32 results are bit-equal to the reference's.
- SiLU-and-mul through `ops` (the native kernel where it runs).
"""
import torch
import torch.nn.functional as F


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, first_expert: int = 0) -> torch.Tensor:
    from kubeinfer.kernels import ops
    from kubeinfer.kernels.references import expert_groups
    num_tokens, top_k = topk_ids.shape
    per_pair = torch.zeros(num_tokens * top_k, x.shape[1], dtype=x.dtype)   # another rank's pairs stay 0
    weights = topk_weights.flatten()
    for expert, pairs in expert_groups(topk_ids, first_expert, w13.shape[0]):
        hidden = ops.silu_and_mul(F.linear(x[pairs // top_k], w13[expert - first_expert]))
        hidden = F.linear(hidden, w2[expert - first_expert]) * weights[pairs, None]
        per_pair.index_copy_(0, pairs, hidden.to(x.dtype))
    by_expert = torch.argsort(topk_ids, dim=1, stable=True)   # each token's pairs in ascending expert order
    rows = per_pair.view(num_tokens, top_k, -1)[torch.arange(num_tokens)[:, None], by_expert]
    out = rows[:, 0].clone()
    for j in range(1, top_k):
        out += rows[:, j]
    return out
