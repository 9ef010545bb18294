"""The model class of each supported architecture."""
from kubeinfer.runtime.models.config import ARCHITECTURES
from kubeinfer.runtime.models.llama import LlamaForCausalLM

MODEL_CLASSES = {name: LlamaForCausalLM for name in ARCHITECTURES}
