"""Attention over the paged KV cache: stores this step's K/V, then attends through the block tables."""
import torch
from torch import nn

from kubeinfer.kernels import ops
from kubeinfer.runtime.context import get_context


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: int | None):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.sliding_window = sliding_window
        # Views into the runner's KV pool, `[num_blocks, block_size, num_kv_heads, head_dim]`, bound at start-up.
        self.k_cache = self.v_cache = torch.empty(0)
        # What an FP8 cache's values are multiplied by when read (it stores K / k_scale, V / v_scale).
        self.k_scale = self.v_scale = 1.0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = get_context().attn
        ops.store_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping, self.k_scale, self.v_scale)
        return ops.paged_attention(q, self.k_cache, self.v_cache, meta, self.scale, self.sliding_window,
                                   self.k_scale, self.v_scale)
