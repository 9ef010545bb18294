"""The shape of one KV block, which a prefill and a decode replica must share before any block moves.

A block is `[2 (K, V), num_layers, block_size, num_kv_heads, head_dim]` of `dtype`: the slice
`kv_cache[:, :, block]` of the model runner's cache. The model's name is part of the layout, so a decode replica of
another model with the same shapes is refused too.
"""
import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    model: str
    dtype: str            # torch dtype name, e.g. "float16"
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of_cache(cls, model: str, kv_cache: torch.Tensor) -> "KVLayout":
        """The layout of a model runner's cache `[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]`."""
        _, num_layers, _, block_size, num_kv_heads, head_dim = kv_cache.shape
        return cls(model, str(kv_cache.dtype).removeprefix("torch."), block_size, num_layers, num_kv_heads, head_dim)

    @property
    def block_shape(self) -> tuple[int, ...]:
        return 2, self.num_layers, self.block_size, self.num_kv_heads, self.head_dim

    @property
    def block_bytes(self) -> int:
        return math.prod(self.block_shape) * getattr(torch, self.dtype).itemsize

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, fields: dict) -> "KVLayout":
        return cls(**{name: fields.get(name) for name in cls.__dataclass_fields__})

    def mismatch(self, other: "KVLayout", this_side: str, other_side: str) -> str | None:
        """What differs between this side's layout and the peer's, in words (sides named by role), or None."""
        differences = [f"{name} {ours!r} on {this_side}, {theirs!r} on {other_side}" for name, ours, theirs in
                       ((name, getattr(self, name), getattr(other, name)) for name in self.__dataclass_fields__)
                       if ours != theirs]
        return "; ".join(differences) or None
