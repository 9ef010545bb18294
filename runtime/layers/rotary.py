"""Rotary position embedding over a precomputed cos/sin table (Llama/NeoX layout)."""
import math

import torch
from torch import nn

from kubeinfer.kernels import ops
from kubeinfer.runtime.models.config import RopeConfig


class RotaryEmbedding(nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int):
        super().__init__()
        self.register_buffer("cos_sin_cache", rope_cos_sin_cache(rope, head_dim, max_positions), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return ops.rotary_embedding(positions, q, k, self.cos_sin_cache)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies, computed exactly as transformers does (same ops, fp32)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin_cache(rope: RopeConfig, head_dim: int, max_positions: int) -> torch.Tensor:
    """`[max_positions, head_dim]`: cos of each frequency in the first half, sin in the second (fp32)."""
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * rope_inv_freq(rope, head_dim)[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
