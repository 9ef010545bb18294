"""Per-forward metadata, set by the model runner before a forward and read by the attention layers.

Per thread: two engines of one process (a prefill and a decode role in a test) may run forwards at once.
"""
import threading
from dataclasses import dataclass

import torch

from kubeinfer.kernels.metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    # Each token's adapter slot (max_loras: the base model) and its plan, made once per forward
    # (kernels.ops.lora_plan); None: no adapters.
    lora: tuple[torch.Tensor, list] | None = None


_local = threading.local()


def set_context(context: ForwardContext | None) -> None:
    _local.context = context


def get_context() -> ForwardContext:
    context = getattr(_local, "context", None)
    assert context is not None, "attention ran outside a forward prepared by the model runner"
    return context


def lora_batch() -> tuple[torch.Tensor, list] | None:
    """The forward's adapter slot per token and their groups, or None (no forward under way, or no adapter)."""
    context = getattr(_local, "context", None)
    return None if context is None else context.lora
