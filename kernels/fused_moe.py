"""The experts of a mixture-of-experts layer as two grouped GEMMs (Triton), over tokens grouped by expert.

1. `align_by_expert` (torch ops, no host sync, so a CUDA graph can hold it): the (token, k) pairs sorted by expert,
   each expert's run padded to a multiple of BLOCK_M, so that every block of BLOCK_M rows belongs to one expert.
   Sizes are bounded, not data-dependent: at most `T*k + E*(BLOCK_M-1)` rows.
2. Gate/up: each block gathers its tokens' rows of `x` and multiplies them by its expert's `w13` -> `[rows, 2I]`.
3. SiLU-and-mul -> `[rows, I]`.
4. Down: each block multiplies its rows by its expert's `w2`, scales each row by the pair's routing weight and
   writes it to the pair's row of `[T*k, H]`; the k rows of a token are then summed.
Experts outside `[first_expert, first_expert + E_local)` (another rank's, under expert parallelism) are skipped:
their pairs add nothing. fp32 accumulation; the result in x's dtype. `references.fused_moe` defines the result.
"""
import torch
import triton
import triton.language as tl

from kubeinfer.kernels.activation import silu_and_mul


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(pair id of each padded row (T*k = padding), expert of each block (-1 = past the end), rows bound)."""
    flat = topk_ids.flatten()
    num_pairs, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start, start = padded_end - padded, torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank_in_expert = torch.arange(num_pairs, device=device) - start[experts_sorted]
    max_rows = num_pairs + num_experts * (block_m - 1)
    max_blocks = triton.cdiv(max_rows, block_m)
    pair_of_row = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int64, device=device)
    pair_of_row[padded_start[experts_sorted] + rank_in_expert] = order
    block_first_row = torch.arange(max_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_first_row, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, torch.full_like(block_expert, -1))
    return pair_of_row, block_expert, max_blocks


@triton.jit
def _grouped_gemm_kernel(
    A, W, Out, PairOfRow, BlockExpert, RouteWeights,
    num_pairs, top_k, first_expert, num_local, N, K,
    stride_a, stride_we, stride_wn, stride_wk, stride_o,
    GATHER_TOKENS: tl.constexpr,   # A rows are tokens (gathered through the pairs); else A's rows are the padded rows
    SCATTER_PAIRS: tl.constexpr,   # rows go to the pair's output row, times its routing weight; else to the padded row
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(BlockExpert + block) - first_expert
    if (expert < 0) | (expert >= num_local):
        return
    rows = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(PairOfRow + rows)
    valid = pairs < num_pairs
    a_rows = pairs // top_k if GATHER_TOKENS else rows
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = W + expert.to(tl.int64) * stride_we
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + a_rows[:, None] * stride_a + ks[None, :], mask=valid[:, None] & (ks[None, :] < K), other=0.0)
        w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None] * stride_wk,
                    mask=(cols[None, :] < N) & (ks[:, None] < K), other=0.0)
        acc += tl.dot(a, w)
    if SCATTER_PAIRS:
        weight = tl.load(RouteWeights + pairs, mask=valid, other=0.0).to(tl.float32)
        acc = acc * weight[:, None]
        out_rows = pairs
    else:
        out_rows = rows
    tl.store(Out + out_rows[:, None] * stride_o + cols[None, :], acc.to(Out.dtype.element_ty),
             mask=valid[:, None] & (cols[None, :] < N))


def _grouped_gemm(a, w, out, pair_of_row, block_expert, max_blocks, route_weights, num_pairs, top_k, first_expert,
                  gather_tokens: bool, scatter_pairs: bool, block_m: int):
    num_local, n, k = w.shape
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    block_k = min(64, max(16, triton.next_power_of_2(k)))
    _grouped_gemm_kernel[(max_blocks, triton.cdiv(n, block_n))](
        a, w, out, pair_of_row, block_expert, route_weights,
        num_pairs, top_k, first_expert, num_local, n, k,
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        GATHER_TOKENS=gather_tokens, SCATTER_PAIRS=scatter_pairs,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, first_expert: int = 0, num_experts: int | None = None,
              block_m: int = 16) -> torch.Tensor:
    """As `references.fused_moe`. `num_experts`: the model's (all ranks'); default first_expert + local experts."""
    num_tokens, top_k = topk_ids.shape
    hidden, num_pairs = x.shape[1], topk_ids.numel()
    num_experts = num_experts or first_expert + w13.shape[0]
    assert x.stride(1) == 1 and w13.shape[2] == hidden and w2.shape[1] == hidden
    pair_of_row, block_expert, max_blocks = align_by_expert(topk_ids, num_experts, block_m)
    gate_up = torch.empty(max_blocks * block_m, w13.shape[1], dtype=x.dtype, device=x.device)
    weights = topk_weights.flatten().contiguous()
    _grouped_gemm(x, w13, gate_up, pair_of_row, block_expert, max_blocks, weights, num_pairs, top_k, first_expert,
                  True, False, block_m)
    hidden_rows = silu_and_mul(gate_up)
    per_pair = torch.zeros(num_pairs, hidden, dtype=x.dtype, device=x.device)   # another rank's pairs stay 0
    _grouped_gemm(hidden_rows, w2, per_pair, pair_of_row, block_expert, max_blocks, weights, num_pairs, top_k,
                  first_expert, False, True, block_m)
    return per_pair.view(num_tokens, top_k, hidden).sum(dim=1)
