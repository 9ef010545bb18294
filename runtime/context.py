"""Per-forward metadata, set by the model runner before a forward and read by the attention layers."""
from dataclasses import dataclass

from kubeinfer.kernels.metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata


_context: ForwardContext | None = None


def set_context(context: ForwardContext | None) -> None:
    global _context
    _context = context


def get_context() -> ForwardContext:
    assert _context is not None, "attention ran outside a forward prepared by the model runner"
    return _context
