"""Per-forward metadata, set by the model runner before a forward and read by the attention layers."""
from dataclasses import dataclass

import torch

from kubeinfer.kernels.metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    # Each token's adapter slot (max_loras: the base model) and its plan (references.lora_plan); None: no adapters.
    lora: tuple[torch.Tensor, list] | None = None


_context: ForwardContext | None = None


def set_context(context: ForwardContext | None) -> None:
    global _context
    _context = context


def get_context() -> ForwardContext:
    assert _context is not None, "attention ran outside a forward prepared by the model runner"
    return _context


def lora_batch() -> tuple[torch.Tensor, list] | None:
    """The forward's adapter slot per token and their groups, or None (no forward under way, or no adapter)."""
    return None if _context is None else _context.lora
