"""Batched LoRA for a linear layer (Triton): each token row gets the low-rank update of its own adapter, many
adapters in one batch, added in place: shrink `x @ A[s]^T -> [rows, R]`, then expand `@ B[s]^T` into each token's
output row. `references.lora_delta` defines the update.

Rows are grouped by adapter slot as the mixture-of-experts kernel groups them by expert (`lora_groups`, from
`fused_moe.align_by_expert`, one "expert" per slot, top-1, no host sync). A step's slots are the same in every
layer, so the groups are made once per forward (the model runner, and each CUDA graph) and shared by every layer.
Rows of the base model (a slot id of `num_slots`) fall outside the slots and add nothing.

The shrink is split over K: a decode step has a few row blocks and R is small, so one program per block would
walk all of `in` alone (the H100 showed it: 90 us a projection, twice the base GEMMs). Each program takes
`SHRINK_K_CHUNK` inputs of one block and writes its partial sums; their sum (fixed order, no atomics) is the shrink.
"""
import torch
import triton
import triton.language as tl

from kubeinfer.kernels.fused_moe import align_by_expert

BLOCK_M = 16            # rows of a group block (tl.dot's smallest M)
SHRINK_K_CHUNK = 256    # inputs summed by one shrink program
EXPAND_BLOCK_N = 64     # output columns of one expand program


def lora_groups(slot_ids: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(token of each padded row (T = padding), slot of each row block (-1 past the end), blocks) for `slot_ids`."""
    ids = slot_ids.clamp(max=num_slots).view(-1, 1)
    return align_by_expert(ids, num_slots + 1, BLOCK_M)


@triton.jit
def _block_tokens(TokenOfRow, block, num_tokens, BLOCK_M: tl.constexpr):
    """The padded rows of a row block, the token of each, and which of them are tokens (not padding)."""
    rows = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    tokens = tl.load(TokenOfRow + rows)
    return rows, tokens, tokens < num_tokens


@triton.jit
def _shrink_kernel(X, A, Partial, TokenOfRow, BlockSlot, num_tokens, num_slots, R, K, k_chunk,
                   stride_x, stride_as, stride_ar, stride_ps, stride_pr,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    block, split = tl.program_id(0), tl.program_id(1)
    slot = tl.load(BlockSlot + block)
    if (slot < 0) | (slot >= num_slots):
        return
    rows, tokens, valid = _block_tokens(TokenOfRow, block, num_tokens, BLOCK_M)
    rs = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    a_base = A + slot.to(tl.int64) * stride_as
    k_start = split * k_chunk
    for k0 in range(k_start, k_start + k_chunk, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + tokens[:, None] * stride_x + ks[None, :], mask=valid[:, None] & (ks[None, :] < K), other=0.0)
        a = tl.load(a_base + rs[None, :] * stride_ar + ks[:, None], mask=(rs[None, :] < R) & (ks[:, None] < K),
                    other=0.0)
        acc += tl.dot(x, a)
    tl.store(Partial + split * stride_ps + rows[:, None] * stride_pr + rs[None, :], acc, mask=rs[None, :] < R)


@triton.jit
def _expand_add_kernel(Shrunk, B, Out, TokenOfRow, BlockSlot, num_tokens, num_slots, N, R,
                       stride_sr, stride_bs, stride_bn, stride_o,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    block = tl.program_id(0)
    slot = tl.load(BlockSlot + block)
    if (slot < 0) | (slot >= num_slots):
        return
    rows, tokens, valid = _block_tokens(TokenOfRow, block, num_tokens, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rs = tl.arange(0, BLOCK_R)
    s = tl.load(Shrunk + rows[:, None] * stride_sr + rs[None, :], mask=valid[:, None] & (rs[None, :] < R), other=0.0)
    b = tl.load(B + slot.to(tl.int64) * stride_bs + cols[None, :] * stride_bn + rs[:, None],
                mask=(cols[None, :] < N) & (rs[:, None] < R), other=0.0)
    delta = tl.dot(s.to(b.dtype), b)
    out_ptrs = Out + tokens[:, None] * stride_o + cols[None, :]
    mask = valid[:, None] & (cols[None, :] < N)
    out = tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, (out + delta).to(Out.dtype.element_ty), mask=mask)


def lora_add(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
             groups: tuple | None = None) -> torch.Tensor:
    """`out += references.lora_delta(x, lora_a, lora_b, slot_ids)` in place; returns `out`. x `[T, in]` and out
    `[T, out]` with unit stride on their columns, lora_a `[S, R, in]`, lora_b `[S, out, R]` (unit stride on R),
    slot_ids `[T]` with S (or any id >= S) for the base model's rows; `groups`: `lora_groups(slot_ids, S)`, made
    here when not given. R >= 16 (tl.dot's smallest K)."""
    num_tokens, k = x.shape
    num_slots, rank, _ = lora_a.shape
    n = lora_b.shape[1]
    assert x.stride(1) == 1 and out.stride(1) == 1 and lora_a.stride(2) == 1 and lora_b.stride(2) == 1
    assert lora_b.shape[0] == num_slots and lora_b.shape[2] == rank and out.shape == (num_tokens, n)
    token_of_row, block_slot, max_blocks = groups if groups is not None else lora_groups(slot_ids, num_slots)
    block_r = max(16, triton.next_power_of_2(rank))
    splits = triton.cdiv(k, SHRINK_K_CHUNK)
    partial = torch.empty(splits, max_blocks * BLOCK_M, rank, dtype=torch.float32, device=x.device)
    _shrink_kernel[(max_blocks, splits)](
        x, lora_a, partial, token_of_row, block_slot, num_tokens, num_slots, rank, k, SHRINK_K_CHUNK,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), partial.stride(0), partial.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_K=64)
    shrunk = partial.sum(0) if splits > 1 else partial[0]
    block_n = EXPAND_BLOCK_N
    _expand_add_kernel[(max_blocks, triton.cdiv(n, block_n))](
        shrunk, lora_b, out, token_of_row, block_slot, num_tokens, num_slots, n, rank,
        shrunk.stride(0), lora_b.stride(0), lora_b.stride(1), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_R=block_r)
    return out


def lora_delta(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
    """As `references.lora_delta` (the update alone, into zeros)."""
    out = torch.zeros(x.shape[0], lora_b.shape[1], dtype=x.dtype, device=x.device)
    return lora_add(out, x, lora_a, lora_b, slot_ids)
