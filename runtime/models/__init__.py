"""Model implementations, chosen by the checkpoint's architecture name."""
from kubeinfer.runtime.models.config import ARCHITECTURES, ModelConfig
from kubeinfer.runtime.models.llama import LlamaForCausalLM

MODEL_CLASSES = {name: LlamaForCausalLM for name in ARCHITECTURES}

__all__ = ["MODEL_CLASSES", "ModelConfig"]
