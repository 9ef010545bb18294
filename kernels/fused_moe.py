"""The experts of a mixture-of-experts layer as two grouped GEMMs (Triton), over tokens grouped by expert.

1. `align_by_expert` (one Triton program, or torch's sort for more than ALIGN_KERNEL_MAX_PAIRS pairs; no host sync,
   so a CUDA graph can hold it): the (token, k) pairs grouped by expert, each expert's run padded to a multiple of
   BLOCK_M, so that every block of BLOCK_M rows belongs to one expert.
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


# Up to this many (token, k) pairs, the alignment is one Triton program and the GEMMs take DECODE_LAUNCH; beyond,
# torch's sort and the default tiles. H100, 128 experts: the program 10.5 / 27.7 / 145.6 us at 8 / 512 / 4096
# pairs, the sort 57.9 / 86.9 / 99.6 (benchmarks/moe_kernel.py --sweep, docs/gpu-logs/2026-11-27-h100).
ALIGN_KERNEL_MAX_PAIRS = 1024
DECODE_LAUNCH = (32, 128, 4, 3)   # BLOCK_N, BLOCK_K, warps, stages: 4-5% under the default at 1-64 tokens there


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(pair id of each padded row (T*k = padding), expert of each block (-1 = past the end), rows bound)."""
    flat = topk_ids.flatten()
    num_pairs, device = flat.numel(), flat.device
    max_rows = num_pairs + num_experts * (block_m - 1)
    max_blocks = triton.cdiv(max_rows, block_m)
    pair_of_row = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int64, device=device)
    if num_pairs <= ALIGN_KERNEL_MAX_PAIRS:
        block_expert = torch.empty(max_blocks, dtype=torch.int64, device=device)
        cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
        _align_kernel[(1,)](flat, pair_of_row, block_expert, cursor, num_pairs, max_blocks, num_experts,
                            BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_P=64, BLOCK_B=64, BLOCK_M=block_m)
        return pair_of_row, block_expert, max_blocks
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start, start = padded_end - padded, torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank_in_expert = torch.arange(num_pairs, device=device) - start[experts_sorted]
    pair_of_row[padded_start[experts_sorted] + rank_in_expert] = order
    block_first_row = torch.arange(max_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_first_row, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, torch.full_like(block_expert, -1))
    return pair_of_row, block_expert, max_blocks


@triton.jit
def _align_kernel(Ids, PairOfRow, BlockExpert, Cursor, num_pairs, max_blocks, num_experts,
                  BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr):
    """align_by_expert in one program (a dozen torch launches took 58 of a 113 us MoE layer at batch 1 on an H100).
    Each pair takes the next row of its expert's run by an atomic increment, so the order of pairs within a run
    varies from call to call; no result does, since every row is computed alone."""
    experts = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for first in range(0, num_pairs, BLOCK_P):
        pairs = first + tl.arange(0, BLOCK_P)
        ids = tl.load(Ids + pairs, mask=pairs < num_pairs, other=BLOCK_E)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    tl.store(Cursor + experts, padded_end - padded, mask=experts < num_experts)
    tl.debug_barrier()
    for first in range(0, num_pairs, BLOCK_P):
        pairs = first + tl.arange(0, BLOCK_P)
        valid = pairs < num_pairs
        ids = tl.load(Ids + pairs, mask=valid, other=0)
        row = tl.atomic_add(Cursor + ids, 1, mask=valid)
        tl.store(PairOfRow + row, pairs, mask=valid)
    total = tl.sum(padded, axis=0)
    for first in range(0, max_blocks, BLOCK_B):
        blocks = first + tl.arange(0, BLOCK_B)
        first_row = blocks * BLOCK_M
        expert = tl.sum((padded_end[None, :] <= first_row[:, None]).to(tl.int32), axis=1)
        tl.store(BlockExpert + blocks, tl.where(first_row < total, expert, -1), mask=blocks < max_blocks)


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
                  gather_tokens: bool, scatter_pairs: bool, block_m: int, launch: tuple[int, int, int, int] | None):
    num_local, n, k = w.shape
    block_n, block_k, num_warps, num_stages = launch or (min(64, max(16, triton.next_power_of_2(n))),
                                                         min(64, max(16, triton.next_power_of_2(k))), 4, 3)
    _grouped_gemm_kernel[(max_blocks, triton.cdiv(n, block_n))](
        a, w, out, pair_of_row, block_expert, route_weights,
        num_pairs, top_k, first_expert, num_local, n, k,
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        GATHER_TOKENS=gather_tokens, SCATTER_PAIRS=scatter_pairs,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, first_expert: int = 0, num_experts: int | None = None,
              block_m: int = 16, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """As `references.fused_moe`. `num_experts`: the model's (all ranks'); default first_expert + local experts.
    `config`: both GEMMs' `(BLOCK_N, BLOCK_K, num_warps, num_stages)` (tests and benchmarks' sweeps)."""
    num_tokens, top_k = topk_ids.shape
    hidden, num_pairs = x.shape[1], topk_ids.numel()
    num_experts = num_experts or first_expert + w13.shape[0]
    assert x.stride(1) == 1 and w13.shape[2] == hidden and w2.shape[1] == hidden
    pair_of_row, block_expert, max_blocks = align_by_expert(topk_ids, num_experts, block_m)
    if config is None and num_pairs <= ALIGN_KERNEL_MAX_PAIRS and x.is_cuda:
        config = DECODE_LAUNCH
    gate_up = torch.empty(max_blocks * block_m, w13.shape[1], dtype=x.dtype, device=x.device)
    weights = topk_weights.flatten().contiguous()
    _grouped_gemm(x, w13, gate_up, pair_of_row, block_expert, max_blocks, weights, num_pairs, top_k, first_expert,
                  True, False, block_m, config)
    hidden_rows = silu_and_mul(gate_up)
    per_pair = torch.zeros(num_pairs, hidden, dtype=x.dtype, device=x.device)   # another rank's pairs stay 0
    _grouped_gemm(hidden_rows, w2, per_pair, pair_of_row, block_expert, max_blocks, weights, num_pairs, top_k,
                  first_expert, False, True, block_m, config)
    return per_pair.view(num_tokens, top_k, hidden).sum(dim=1)
