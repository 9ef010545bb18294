"""Linear layers that shard themselves over the tensor-parallel group.

Each parameter carries a `weight_loader(param, source, shard_id=None)` that reads only this rank's part of
a checkpoint tensor. `source` is a `checkpoint.TensorSource` (or a tensor): indexing it reads just that range,
and its `read_into` reads a range of rows straight into the parameter (no intermediate tensor).
Column-parallel layers split the output features; row-parallel layers split the input features and
all-reduce their output; the model code never looks at the rank. On the CPU a bf16 or fp32 weight is packed once after
loading (`pack_cpu_weights`, kernels/cpu_linear.py).
"""
import torch
from torch import nn

from kubeinfer.kernels import cpu_linear, ops
from kubeinfer.runtime.parallel import all_reduce, tp_rank, tp_size


def read_slice(source, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
    """Rows and columns of a checkpoint tensor (a tensor, or a safetensors slice read only where asked)."""
    if rows is None and cols is None:
        return source[:]
    if cols is None:
        return source[rows]
    return source[rows if rows is not None else slice(None), cols]


def source_shape(source) -> tuple[int, ...]:
    """The shape of a checkpoint tensor or safetensors slice, without reading it."""
    return tuple(source.get_shape()) if hasattr(source, "get_shape") else tuple(source.shape)


def copy_into(dest: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    """A loaded shard into its parameter; a shape that differs is the checkpoint's error, named."""
    if dest.shape != loaded.shape:
        raise ValueError(f"{name}: checkpoint shard has shape {tuple(loaded.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(loaded)


def load_rows(dest: torch.Tensor, source, rows: slice | None, name: str) -> None:
    """Rows `rows` (all when None) of `source` into `dest`: read into it directly when the source can."""
    if hasattr(source, "read_into"):
        source.read_into(dest, rows or slice(None), name)
    else:
        copy_into(dest, read_slice(source, rows), name)


class LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        self.packed = None   # the weight laid out for the CPU GEMM (cpu_linear.pack), once packed (the weight is freed)
        self.in_features, self.out_features = in_features, out_features   # this rank's shard
        self.lora = None   # runtime/lora/layers.LoraSlots, where adapters are served

    def project(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.packed is not None:
            return cpu_linear.linear(x, self.packed, bias)
        return ops.linear(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(x, self.bias)
        return out if self.lora is None else self.lora.add_to(x, out)

    def pack_weight(self) -> bool:
        """Packs the weight for oneDNN's GEMM on the CPU (and frees the plain one) where it can; whether it did."""
        if self.packed is not None or not cpu_linear.can_pack(self.weight):
            return False
        self.packed = cpu_linear.pack(self.weight.data)
        self.weight.data = self.weight.data.new_empty(0)
        return True


def pack_cpu_weights(model: nn.Module) -> int:
    """Packs the bf16 or fp32 CPU weight of every layer that can (linear layers, an untied LM head) once
    (kernels/cpu_linear.py); how many it packed."""
    return sum(module.pack_weight() for module in model.modules() if hasattr(module, "pack_weight"))


class ReplicatedLinear(LinearBase):
    def weight_loader(self, param: nn.Parameter, source, shard_id=None) -> None:
        load_rows(param.data, source, None, "replicated linear")


class ColumnParallelLinear(LinearBase):
    """Splits the output features: rank r holds rows `[r*n, (r+1)*n)` of the weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        assert out_features % tp_size() == 0, f"{out_features} output features do not split over {tp_size()} ranks"
        super().__init__(in_features, out_features // tp_size(), bias)

    def weight_loader(self, param: nn.Parameter, source, shard_id=None) -> None:
        rows = param.shape[0]
        start = tp_rank() * rows
        load_rows(param.data, source, slice(start, start + rows), "column-parallel linear")


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul (e.g. gate and up)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, source, shard_id: int = 0) -> None:
        size = self.output_sizes[shard_id] // tp_size()
        offset = sum(self.output_sizes[:shard_id]) // tp_size()
        start = tp_rank() * size
        load_rows(param.data[offset:offset + size], source, slice(start, start + size),
                  f"merged linear shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections in one matmul; heads are split over ranks, KV heads replicated when fewer."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        size = tp_size()
        assert num_heads % size == 0, f"{num_heads} attention heads do not split over {size} ranks"
        assert num_kv_heads % size == 0 or size % num_kv_heads == 0, \
            f"{num_kv_heads} KV heads neither split over nor replicate onto {size} ranks"
        self.head_dim = head_dim
        self.num_heads = num_heads // size
        self.num_kv_heads = max(1, num_kv_heads // size)
        self.kv_replicas = max(1, size // num_kv_heads)   # ranks that hold the same KV head
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        LinearBase.__init__(self, hidden_size, out, bias)

    def weight_loader(self, param: nn.Parameter, source, shard_id: str = "q") -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, start = 0, q_size, tp_rank() * q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, start = kv_size, (tp_rank() // self.kv_replicas) * kv_size
        load_rows(param.data[offset:offset + size], source, slice(start, start + size), f"qkv shard {shard_id}")


class RowParallelLinear(LinearBase):
    """Splits the input features; the partial outputs are summed over ranks (bias added once)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        assert in_features % tp_size() == 0, f"{in_features} input features do not split over {tp_size()} ranks"
        super().__init__(in_features // tp_size(), out_features, bias)

    def weight_loader(self, param: nn.Parameter, source, shard_id=None) -> None:
        if param.dim() == 1:  # the bias is not split
            load_rows(param.data, source, None, "row-parallel bias")
            return
        cols = param.shape[1]
        if cols == source_shape(source)[-1]:   # one rank: the whole tensor, read straight in
            load_rows(param.data, source, None, "row-parallel linear")
            return
        start = tp_rank() * cols
        copy_into(param.data, read_slice(source, None, slice(start, start + cols)), "row-parallel linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(x, self.bias if tp_rank() == 0 else None)
        return all_reduce(out if self.lora is None else self.lora.add_to(x, out))   # partial updates summed too
