"""Per-forward attention metadata, shared by the attention kernels and their references."""
from dataclasses import dataclass

import torch

# The 8-bit KV cache's element type (`--kv-cache-dtype fp8_e4m3`): 4 exponent bits, 3 of mantissa, finite
# up to 448. The cache holds K / k_scale (V / v_scale), saturated to that range (see `store_kv`).
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


@dataclass
class AttentionMetadata:
    """Describes one forward over a batch of sequences flattened along the token axis.

    Sequence `i` contributes query tokens `cu_seqlens_q[i]:cu_seqlens_q[i+1]`; these are the last tokens of
    its first `seq_lens[i]` tokens, whose K/V are already in the paged cache (this step's new K/V included).
    Query token `j` of a chunk of `n` sits at position `seq_lens[i] - n + j` and sees keys `0..that position`
    (and only the last `sliding_window` of them when a window is set).
    """
    cu_seqlens_q: torch.Tensor     # int32 [num_seqs + 1]
    seq_lens: torch.Tensor         # int32 [num_seqs]
    block_tables: torch.Tensor     # int32 [num_seqs, max_blocks_per_seq], padded with 0
    max_seqlen_q: int
    max_seqlen_k: int
    slot_mapping: torch.Tensor     # int64 [num_tokens]; slot of each new token's K/V, -1 to skip

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.numel()

    @property
    def is_decode_only(self) -> bool:
        return self.max_seqlen_q == 1
