"""Pads a step's query chunks to q tokens each, the fixed shape of the speculative CUDA graphs (`cuda_graphs`).

Chunk i (tokens `cu_seqlens_q[i]:cu_seqlens_q[i+1]`, the last of its first `seq_lens[i]` tokens) becomes rows
`i*q : (i+1)*q`: its tokens first, at their own positions, then padding (token 0, KV slot -1 so nothing is stored,
positions running on, capped at `max_position`). Its seq_len becomes start + q, so under the attention metadata's
rule (query j of a chunk of n sits at position seq_len - n + j) every real token keeps its position and sees only
the keys before it; the padding's queries read whatever the cache holds past them, and their outputs are dropped.
"""
from dataclasses import dataclass

import torch


@dataclass
class PaddedChunks:
    input_ids: torch.Tensor      # int64 [num_seqs * q]
    positions: torch.Tensor      # int64 [num_seqs * q]
    seq_lens: torch.Tensor       # int32 [num_seqs]
    slot_mapping: torch.Tensor   # int64 [num_seqs * q]
    rows: torch.Tensor           # int64 [num_tokens]: the padded row of each of the step's token rows


def pad_chunks(input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
               slot_mapping: torch.Tensor, q: int, max_position: int) -> PaddedChunks:
    lengths = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    num_seqs = lengths.numel()
    assert int(lengths.max()) <= q, f"a chunk of {int(lengths.max())} tokens does not fit {q}"
    owner = torch.repeat_interleave(torch.arange(num_seqs), lengths)
    rows = owner * q + torch.arange(input_ids.numel()) - cu_seqlens_q[:-1].long()[owner]
    starts = seq_lens.long() - lengths
    padded_ids = torch.zeros(num_seqs * q, dtype=torch.int64)
    padded_ids[rows] = input_ids
    padded_slots = torch.full((num_seqs * q,), -1, dtype=torch.int64)
    padded_slots[rows] = slot_mapping
    padded_positions = (starts[:, None] + torch.arange(q)).clamp(max=max_position).flatten()
    padded_positions[rows] = positions   # the real tokens' own positions, never capped
    return PaddedChunks(input_ids=padded_ids, positions=padded_positions, seq_lens=(starts + q).to(torch.int32),
                        slot_mapping=padded_slots, rows=rows)
