"""A PEFT LoRA adapter read from its folder (`adapter_config.json` + `adapter_model.safetensors`), checked against
the base model before anything is served with it.

Each targeted projection keeps `A [r, in]` and `B [out, r]` on the host in fp32, with the adapter's scaling
(lora_alpha / r, or / sqrt(r) with rsLoRA) folded into B. Errors name the adapter, the file and what is wrong:
they become the API's 400 for `/v1/load_lora_adapter` and the operator's condition.
"""
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.models.config import ModelConfig

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION_MODULES + MLP_MODULES


class LoraError(InvalidRequestError):
    """An adapter that cannot be served on this model (the request's fault: HTTP 400)."""

    def __init__(self, message: str):
        super().__init__(message, "lora_path")


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]   # (layer, module) -> (A, scaled B)
    digest: str = ""   # of its two files' bytes: its identity for the prefix cache, whatever its name or folder

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def module_shapes(config: ModelConfig, layer: int) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of `layer` an adapter may target; a mixture-of-experts layer's
    MLP is the experts', which adapters do not reach here."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"q_proj": (config.hidden_size, q), "k_proj": (config.hidden_size, kv), "v_proj": (config.hidden_size, kv),
              "o_proj": (q, config.hidden_size)}
    if config.moe is None or not config.moe.sparse_layers[layer]:
        size = config.intermediate_size
        shapes |= {"gate_proj": (config.hidden_size, size), "up_proj": (config.hidden_size, size),
                   "down_proj": (size, config.hidden_size)}
    return shapes


def _read_config(folder: Path, name: str, max_rank: int) -> tuple[int, float]:
    """The adapter's rank and scaling, after refusing what this runtime does not serve."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise LoraError(f"adapter {name!r}: {config_file} not found (a PEFT LoRA folder has adapter_config.json "
                        "and adapter_model.safetensors)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as error:
        raise LoraError(f"adapter {name!r}: {config_file} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise LoraError(f"adapter {name!r}: {config_file} is not a JSON object")
    refusals = [(config.get("peft_type", "LORA") != "LORA", f"peft_type {config.get('peft_type')!r} (LORA only)"),
                (bool(config.get("use_dora")), "DoRA (use_dora)"),
                (config.get("bias", "none") != "none", f"trained biases (bias {config.get('bias')!r})"),
                (bool(config.get("modules_to_save")), "modules_to_save"),
                (bool(config.get("fan_in_fan_out")), "fan_in_fan_out"),
                (bool(config.get("rank_pattern")) or bool(config.get("alpha_pattern")), "per-module ranks or alphas")]
    for refused, what in refusals:
        if refused:
            raise LoraError(f"adapter {name!r}: {what} is not supported")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoraError(f"adapter {name!r}: adapter_config.json has no valid rank r (got {rank!r})")
    if rank > max_rank:
        raise LoraError(f"adapter {name!r} has rank {rank}, above this server's --max-lora-rank {max_rank}")
    alpha = float(config.get("lora_alpha", rank))
    return rank, alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def _parse_key(key: str) -> tuple[int, str, str] | None:
    """`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` -> (3, "q_proj", "A")."""
    parts = key.split(".")
    if "layers" not in parts or len(parts) < 4 or parts[-1] != "weight" or parts[-2] not in ("lora_A", "lora_B"):
        return None
    layer = parts[parts.index("layers") + 1]
    return (int(layer), parts[-3], parts[-2][-1]) if layer.isdigit() else None


def load_adapter(name: str, path: str, model_config: ModelConfig, max_rank: int) -> LoraAdapter:
    """Reads and checks the adapter at `path` for this base model."""
    folder = Path(path)
    if not folder.is_dir():
        raise LoraError(f"adapter {name!r}: {path} is not a folder")
    rank, scaling = _read_config(folder, name, max_rank)
    weights_file = folder / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise LoraError(f"adapter {name!r}: {weights_file} not found (safetensors weights only)")
    halves = _read_halves(name, weights_file)
    if not halves:
        raise LoraError(f"adapter {name!r}: {weights_file.name} holds no LoRA weights")
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        where = f"adapter {name!r}, layer {layer} {module}"
        if module not in SUPPORTED_MODULES:
            raise LoraError(f"{where}: only {', '.join(SUPPORTED_MODULES)} are supported")
        if not 0 <= layer < model_config.num_layers:
            raise LoraError(f"{where}: the base model has {model_config.num_layers} layers (another base model?)")
        shapes = module_shapes(model_config, layer)
        if module not in shapes:
            raise LoraError(f"{where}: this layer's MLP is a mixture of experts, which adapters cannot target here")
        if set(pair) != {"A", "B"}:
            raise LoraError(f"{where}: lora_A and lora_B must both be present")
        d_in, d_out = shapes[module]
        a, b = pair["A"], pair["B"]
        if a.shape != (rank, d_in) or b.shape != (d_out, rank):
            raise LoraError(f"{where}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit the base model "
                            f"(expected ({rank}, {d_in}) and ({d_out}, {rank}): an adapter of another base model?)")
        weights[(layer, module)] = (a, b * scaling)
    try:
        digest = content_digest(folder / "adapter_config.json", weights_file)
    except OSError as error:   # removed or replaced while being read
        raise LoraError(f"adapter {name!r}: cannot read {path}: {error}") from None
    return LoraAdapter(name, str(folder), rank, weights, digest)


def _read_halves(name: str, weights_file: Path) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """A and B of each (layer, module) in the file; a truncated, corrupt or vanishing file is the adapter's error."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights_file), framework="pt") as tensors:
            for key in tensors.keys():
                parsed = _parse_key(key)
                if parsed is None:
                    raise LoraError(f"adapter {name!r}: unexpected tensor {key} in {weights_file.name}")
                layer, module, half = parsed
                halves.setdefault((layer, module), {})[half] = tensors.get_tensor(key).float()
    except (OSError, SafetensorError) as error:
        raise LoraError(f"adapter {name!r}: {weights_file} cannot be read ({error}): truncated or corrupt?") from None
    return halves


def content_digest(*files: Path) -> str:
    """SHA-256 over the files' lengths and bytes: equal for the same adapter under any name or folder, different
    for other weights or scaling (the KV an adapter computes depends on nothing else)."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.stat().st_size.to_bytes(8, "little"))
        with open(file, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
