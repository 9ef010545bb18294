"""Parallel state of this process: the ranks of its group, and which of them split attention.

All ranks of a replica join one `torch.distributed` group (its world). Attention, the dense MLPs, the embedding and
the LM head split over the *tensor-parallel* ranks: the whole world, or none of it when attention is replicated
(tensor_parallel_size 1 with expert parallelism: every rank computes the whole attention). A mixture-of-experts
layer splits its experts over the whole world (`ep_size`, `ep_rank`) and sums their outputs over it.
Outside a group every size is 1.
"""
import torch
import torch.distributed as dist

_attention_replicated = False


def set_tensor_parallel(tensor_parallel_size: int) -> None:
    """Called once the group exists: a tensor-parallel size of 1 in a larger world replicates attention."""
    global _attention_replicated
    _attention_replicated = tensor_parallel_size == 1


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def world_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    return 1 if _attention_replicated else world_size()


def tp_rank() -> int:
    return 0 if _attention_replicated else world_rank()


ep_size, ep_rank = world_size, world_rank   # expert parallelism always spans the whole group


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sums `x` over the tensor-parallel ranks."""
    if tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_reduce_world(x: torch.Tensor) -> torch.Tensor:
    """Sums `x` over every rank of the group (the experts' partial outputs)."""
    if world_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenates each tensor-parallel rank's `x` along the last dimension (every rank gets the whole)."""
    if tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int, device: torch.device) -> int:
    """The smallest of every rank's `value` (every rank must call it)."""
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
