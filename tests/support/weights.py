"""An engine's weights as copies, and their comparison byte for byte (sleep and the weight cache must give back
exactly what the engine held)."""
import torch

from kubeinfer.runtime.engine.sleep import weight_slots


def weights_of(llm) -> list[torch.Tensor]:
    return [slot.get().clone() for slot in weight_slots([llm.engine.model_runner.model])]


def same_bytes(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> bool:
    return all(torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
               for a, b in zip(ours, theirs, strict=True))
