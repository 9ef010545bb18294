"""Token embedding and LM head, each rank holding a contiguous slice of the vocabulary.

A vocabulary that does not split evenly is padded up to `num_shards * shard_size`: the last ranks hold
zero rows past the real vocabulary, which no token id reaches and which the LM head cuts off its logits.
"""
import torch
import torch.nn.functional as F
from torch import nn

from kubeinfer.kernels import cpu_linear, ops
from kubeinfer.runtime.cpu_allocator import MMAP_THRESHOLD_BYTES
from kubeinfer.runtime.layers.linear import load_rows
from kubeinfer.runtime.parallel import all_gather_last_dim, all_reduce, tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // tp_size())
        self.start = tp_rank() * self.shard_size
        self.num_real_rows = max(0, min(self.shard_size, vocab_size - self.start))   # the rest is padding
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, source, shard_id=None) -> None:
        shape = tuple(source.get_shape()) if hasattr(source, "get_shape") else tuple(source.shape)
        if shape != (self.vocab_size, param.shape[1]):
            raise ValueError(f"embedding has shape {shape}, expected {(self.vocab_size, param.shape[1])}")
        param.data[self.num_real_rows:].zero_()
        if self.num_real_rows:
            load_rows(param.data[:self.num_real_rows], source, slice(self.start, self.start + self.num_real_rows),
                      "embedding")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.shard_size)
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(y.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states onto the vocabulary; every rank gets the full logits (padding cut off)."""

    packed = None   # the weight laid out for the CPU GEMM (cpu_linear.pack): a head's own copy when tied
    _kept = None    # the packed CPU head's logits buffer, once a step's logits outgrow the mmap threshold

    def pack_weight(self) -> bool:
        """As LinearBase.pack_weight. A head tied to the embedding packs a copy and keeps the plain weight, which the
        embedding reads: one more vocabulary-sized matrix in memory for a head 2.2-2.5x faster at 1-64 rows
        (`F.linear` on the plain layout against the packed copy, 49k and 152k vocabularies, 2-core AVX2 box:
        docs/benchmarks/cpu-runtime.md, "Real model shapes"), and the head is a fifth of a decode step on such a
        vocabulary."""
        if self.packed is not None or not cpu_linear.can_pack(self.weight):
            return False
        self.packed = cpu_linear.pack(self.weight.data)
        if not getattr(self, "tied", False):
            self.weight.data = self.weight.data.new_empty(0)
        return True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of `hidden`'s rows. Past glibc's mmap threshold, on the CPU, they are written into a buffer the
        head keeps (`kept_output`): valid until the head's next call."""
        if self.packed is None:
            projected = ops.linear(hidden, self.weight)
        elif isinstance(self.packed, cpu_linear.Panels):
            projected = cpu_linear.panel_linear(hidden, self.packed, out=self.kept_output(hidden))
        else:
            projected = cpu_linear.linear(hidden, self.packed)
        logits = all_gather_last_dim(projected)
        return logits[..., :self.vocab_size] if logits.shape[-1] != self.vocab_size else logits

    def kept_output(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Where the packed CPU head writes the logits of `hidden [rows, hidden_size]`: None (a new tensor) below
        glibc's mmap threshold, which the heap reuses; above it, rows of a buffer kept by the head, grown to the most
        rows asked for. A new tensor that size is fresh pages from the kernel at every step, each faulted in and
        zeroed: 64 rows of a 152k vocabulary (Qwen2.5), 39 MB, cost 16 ms more than the buffer a decode step
        (2-vCPU box, 2026-12-01)."""
        rows, size = hidden.numel() // hidden.shape[-1], self.packed.out_features
        if rows * size * hidden.element_size() < MMAP_THRESHOLD_BYTES:
            return None
        kept = self._kept
        if kept is None or kept.shape[0] < rows or kept.dtype != hidden.dtype:
            kept = self._kept = torch.empty(rows, size, dtype=hidden.dtype)
        return kept[:rows]

    def release_output(self) -> None:
        """Frees the kept logits buffer (a sleeping engine's memory); the next large call allocates it again."""
        self._kept = None
