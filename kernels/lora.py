"""Batched LoRA for a linear layer (Triton): each token row gets the low-rank update of its own adapter, many
adapters in one batch, in two grouped GEMMs over the rows grouped by adapter slot: shrink `x @ A[s]^T -> [rows, R]`,
then expand `-> @ B[s]^T`, written to each token's row.

The grouping is the mixture-of-experts kernel's (`fused_moe.align_by_expert`, one "expert" per adapter slot, top-1,
no host sync): the same grouped GEMM does both products. Rows of the base model (a slot id of `num_slots`) fall
outside the slots and add nothing. `references.lora_delta` defines the result.
"""
import torch

from kubeinfer.kernels.fused_moe import _grouped_gemm, align_by_expert


def lora_delta(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
               block_m: int = 16) -> torch.Tensor:
    """As `references.lora_delta`. x `[T, in]` (unit stride on `in`), lora_a `[S, R, in]`, lora_b `[S, out, R]`,
    slot_ids `[T]` int64 with S (or any id >= S) for the base model's rows. R >= 16 (tl.dot's smallest K)."""
    num_tokens = x.shape[0]
    num_slots, rank, _ = lora_a.shape
    assert x.stride(1) == 1 and lora_b.shape[0] == num_slots and lora_b.shape[2] == rank
    ids = slot_ids.clamp(max=num_slots).view(-1, 1)
    pair_of_row, block_slot, max_blocks = align_by_expert(ids, num_slots + 1, block_m)
    ones = torch.ones(num_tokens, dtype=torch.float32, device=x.device)
    shrunk = torch.empty(max_blocks * block_m, rank, dtype=x.dtype, device=x.device)
    _grouped_gemm(x, lora_a, shrunk, pair_of_row, block_slot, max_blocks, ones, num_tokens, 1, 0, True, False,
                  block_m)
    out = torch.zeros(num_tokens, lora_b.shape[1], dtype=x.dtype, device=x.device)
    _grouped_gemm(shrunk, lora_b, out, pair_of_row, block_slot, max_blocks, ones, num_tokens, 1, 0, False, True,
                  block_m)
    return out
