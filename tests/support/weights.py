"""An engine's weights as copies, and their comparison byte for byte (sleep and the weight cache must give back
exactly what the engine held); the CPU GEMM's layout chosen for a test (kernels/cpu_linear.py)."""
import torch

from kubeinfer.kernels import cpu_linear
from kubeinfer.runtime.engine.sleep import weight_slots
from kubeinfer.runtime.models.weights import flat_bytes


def weights_of(llm) -> list[torch.Tensor]:
    """Each weight's bytes (a oneDNN-packed one's plain weight's), copied."""
    return [flat_bytes(slot.get()).clone() for slot in weight_slots([llm.engine.model_runner.model])]


def same_bytes(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def use_linear_layout(monkeypatch, choice: str) -> None:
    """Engines built from here on (in this process) lay out their CPU linear weights by `choice`: "auto" (this CPU's
    default: panels where their kernel runs) or "onednn"."""
    monkeypatch.setenv(cpu_linear.CHOICE_ENV, choice)
    monkeypatch.setattr(cpu_linear, "_kernel", [])
