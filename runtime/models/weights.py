"""The weights of a built model as the engine holds them: each parameter once (a tied head's is its embedding's) and
each packed copy of one (a module's `packed`: kernels/cpu_linear.py's panels, or oneDNN's opaque layout, kept as
the plain weight it was packed from). The node's weight cache (weight_cache.py) writes and reads them; a sleeping
engine (engine/sleep.py) moves them out and back.
"""
import math
import mmap
from collections.abc import Iterator

import torch
from torch import nn

from kubeinfer.kernels.cpu_linear import Panels, onednn_pack, onednn_unpack


def named_weights(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, object]]:
    """(module name, module, attribute, value) in the modules' order (the same for two builds of one model):
    attribute "param:NAME" with the Parameter, or "packed" with a tensor or Panels."""
    seen = set()
    for name, module in model.named_modules():
        for param_name, param in module._parameters.items():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                yield name, module, f"param:{param_name}", param
        if getattr(module, "packed", None) is not None:
            yield name, module, "packed", module.packed


def tensor_of(value) -> torch.Tensor:
    """The tensor of a weight `named_weights` yields (a Parameter's data, a Panels' data, or the tensor itself)."""
    return value.data if isinstance(value, (nn.Parameter, Panels)) else value


def is_opaque(tensor: torch.Tensor) -> bool:
    """oneDNN's packed layout: no bytes of its own to copy out or in (`flat_bytes` gives the plain weight's)."""
    return tensor.layout != torch.strided or tensor.is_mkldnn


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bytes as one flat uint8 tensor (a view where it is contiguous); an opaque one's plain weight's."""
    if is_opaque(tensor):
        tensor = onednn_unpack(tensor)
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def packed_as(plain: torch.Tensor, opaque: bool) -> torch.Tensor:
    """A weight read back from its bytes (`flat_bytes`) as it was held: packed again where it was opaque."""
    return onednn_pack(plain) if opaque else plain


def private_mapping(fileno: int, size: int = 0) -> mmap.mmap:
    """A private (copy-on-write: nothing reaches the file) mapping of a weights file, `size` bytes (0: all of it).
    Tensors made by `mapped` keep it alive; once none is left, it is unmapped."""
    return mmap.mmap(fileno, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def mapped(mapping: mmap.mmap, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """The weight stored at `offset` of `mapping`, as a view of it (no copy: its pages come in when first read)."""
    count = math.prod(shape) * dtype.itemsize
    return torch.frombuffer(mapping, dtype=torch.uint8, count=count, offset=offset).view(dtype).view(shape)
