"""Token embedding and LM head, each rank holding a contiguous slice of the vocabulary."""
import torch
import torch.nn.functional as F
from torch import nn

from kubeinfer.runtime.parallel import all_gather_last_dim, all_reduce, tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        assert vocab_size % tp_size() == 0, f"vocabulary of {vocab_size} does not split over {tp_size()} ranks"
        self.shard_size = vocab_size // tp_size()
        self.start = tp_rank() * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, source, shard_id=None) -> None:
        loaded = source[self.start:self.start + self.shard_size]
        if param.shape != loaded.shape:
            raise ValueError(f"embedding shard has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
        param.data.copy_(loaded)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.shard_size)
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(y.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states onto the vocabulary; every rank gets the full logits."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return all_gather_last_dim(F.linear(hidden, self.weight))
