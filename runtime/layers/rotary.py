"""Rotary position embedding over a precomputed cos/sin table (Llama/NeoX layout)."""
import torch
from torch import nn

from kubeinfer.kernels import ops
from kubeinfer.runtime.models.config import RopeConfig, rope_cos_sin_cache


class RotaryEmbedding(nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int):
        super().__init__()
        self.register_buffer("cos_sin_cache", rope_cos_sin_cache(rope, head_dim, max_positions), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return ops.rotary_embedding(positions, q, k, self.cos_sin_cache)
