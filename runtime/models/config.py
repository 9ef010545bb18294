"""The model's `config.json`, parsed once into a typed, architecture-neutral description."""
import json
from dataclasses import dataclass
from pathlib import Path

from kubeinfer.runtime.errors import ModelLoadError, UnsupportedModelError

# Architecture name -> (qkv bias, q/k RMSNorm, sliding window on every layer)
ARCHITECTURES = {
    "LlamaForCausalLM": ("attention_bias", False, False),
    "MistralForCausalLM": ("attention_bias", False, True),
    "Qwen2ForCausalLM": (True, False, False),
    "Qwen3ForCausalLM": ("attention_bias", True, False),
    "MixtralForCausalLM": ("attention_bias", False, True),
    "Qwen2MoeForCausalLM": (True, False, False),
    "Qwen3MoeForCausalLM": ("attention_bias", True, False),
}
ROPE_TYPES = ("default", "linear", "llama3")
# Checkpoint dtypes by name, with their size in bytes. Names, not torch dtypes: reading a config needs no torch
# (the API process reads it and never imports torch).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class MoeConfig:
    """The mixture-of-experts part of a model: which layers route, to how many experts of what size."""
    num_experts: int
    top_k: int
    intermediate_size: int                  # of one expert
    renormalize: bool                       # the top-k probabilities rescaled to sum to 1
    sparse_layers: tuple[bool, ...]         # per layer: experts (True) or a dense MLP (False)
    shared_expert_intermediate_size: int    # Qwen2-MoE's always-on expert, behind a sigmoid gate; 0 = none
    weights_in_fp32: bool                   # Mixtral keeps the routing weights in fp32; Qwen casts them
    expert_parallel_size: int = 1           # set by the engine: whole experts split over this many ranks


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    sliding_windows: tuple[int | None, ...]   # per layer; None = full attention
    dtype_name: str                           # a key of DTYPE_BYTES
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    moe: MoeConfig | None = None              # None: a dense model

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{model_dir}: no config.json; expected a Hugging Face model folder")
        raw = json.loads(path.read_text())
        generation = Path(model_dir) / "generation_config.json"
        eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
        return parse_config(raw, eos if eos is not None else raw.get("eos_token_id"))

    @property
    def dtype(self):
        """The checkpoint's torch dtype (imports torch: for the engine's side only)."""
        return torch_dtype(self.dtype_name)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype_name]


def parse_config(raw: dict, eos_token_id: int | list[int] | None = None) -> ModelConfig:
    architecture = (raw.get("architectures") or ["?"])[0]
    if architecture not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    qkv_bias, qk_norm, sliding_everywhere = ARCHITECTURES[architecture]
    attention_bias = bool(raw.get("attention_bias", False))
    num_heads = raw["num_attention_heads"]
    num_layers = raw["num_hidden_layers"]
    hidden_size = raw["hidden_size"]
    dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if dtype_name not in DTYPE_BYTES:
        raise UnsupportedModelError(f"checkpoint dtype {dtype_name!r} is not supported; use one of {list(DTYPE_BYTES)}")
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    return ModelConfig(
        architecture=architecture,
        vocab_size=raw["vocab_size"],
        hidden_size=hidden_size,
        intermediate_size=raw["intermediate_size"],
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or hidden_size // num_heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        rope=parse_rope(raw),
        qkv_bias=attention_bias if qkv_bias == "attention_bias" else qkv_bias,
        o_bias=attention_bias and architecture in ("LlamaForCausalLM", "MistralForCausalLM"),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=qk_norm,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_windows=_sliding_windows(raw, num_layers, sliding_everywhere),
        dtype_name=dtype_name,
        eos_token_ids=tuple(eos_token_id or ()),
        bos_token_id=raw.get("bos_token_id"),
        moe=parse_moe(raw, architecture, num_layers),
    )


def parse_moe(raw: dict, architecture: str, num_layers: int) -> MoeConfig | None:
    """Mixtral: every layer routes, renormalized top-k. Qwen2/3-MoE: layers route per `decoder_sparse_step` and
    `mlp_only_layers`, renormalized when `norm_topk_prob`; Qwen2-MoE adds a shared expert."""
    if "Moe" not in architecture and architecture != "MixtralForCausalLM":
        return None
    num_experts = raw.get("num_experts") or raw.get("num_local_experts")
    top_k = raw.get("num_experts_per_tok")
    if not num_experts or not top_k or top_k > num_experts:
        raise UnsupportedModelError(f"{architecture}: num_experts ({num_experts}) and num_experts_per_tok ({top_k}) "
                                    f"must be set, with 1 <= num_experts_per_tok <= num_experts")
    if architecture == "MixtralForCausalLM":
        return MoeConfig(num_experts, top_k, raw["intermediate_size"], True, (True,) * num_layers, 0, True)
    step, dense = raw.get("decoder_sparse_step") or 1, set(raw.get("mlp_only_layers") or ())
    sparse = tuple(layer not in dense and (layer + 1) % step == 0 for layer in range(num_layers))
    shared = raw.get("shared_expert_intermediate_size") or 0 if architecture == "Qwen2MoeForCausalLM" else 0
    return MoeConfig(num_experts, top_k, raw["moe_intermediate_size"], bool(raw.get("norm_topk_prob", False)),
                     sparse, shared, False)


def parse_rope(raw: dict) -> RopeConfig:
    """Reads transformers 5's `rope_parameters` or the older top-level `rope_theta` + `rope_scaling`."""
    params = dict(raw.get("rope_parameters") or {})
    if not params:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1 is not supported")
    known = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    return RopeConfig(theta=float(params.get("rope_theta", 10000.0)), rope_type=rope_type,
                      **{k: v for k, v in params.items() if k in known})


def _sliding_windows(raw: dict, num_layers: int, sliding_everywhere: bool) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    if sliding_everywhere:
        return (window,) * num_layers
    layer_types = raw.get("layer_types")
    if layer_types is None:  # Qwen2/Qwen3 checkpoints from before transformers 5
        use = raw.get("use_sliding_window", False)
        start = raw.get("max_window_layers", num_layers)
        layer_types = ["sliding_attention" if use and window and i >= start else "full_attention"
                       for i in range(num_layers)]
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)


def torch_dtype(name: str):
    """The torch dtype of a DTYPE_BYTES name."""
    import torch
    return getattr(torch, name)
