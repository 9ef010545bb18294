"""The built-in demo models: a tiny random-weight Llama (`demo`) and a tiny random-weight Qwen3-MoE (`demo-moe`, 8
experts, 2 active per token), with a byte-level BPE tokenizer trained offline.

`--model demo` (or `demo-moe`) builds it once under the user's cache directory, so the runtime works on a fresh
machine with no download. The runtime image bakes both side by side. Their weights are random: their text is too.
"""
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.trained_models import SMOLLM2_NAME, smollm2_dir

logger = logging.getLogger(__name__)
DEMO_NAME = "demo"
DEMO_MOE_NAME = "demo-moe"
DEMO_VERSION = "v1"
DEMO_DIR_ENV = "KUBEINFER_DEMO_MODEL_DIR"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Kubernetes runs containers on a fleet of machines and keeps them in the state that you declare.",
    "An operator watches custom resources and reconciles the cluster towards what they describe.",
    "A language model predicts the next token from the tokens before it, one step at a time.",
    "The key and value cache keeps the attention state of every token already seen, in fixed-size blocks.",
    "Continuous batching adds new requests to the running batch as soon as there is room for them.",
    "Prometheus scrapes metrics over HTTP and answers queries written in PromQL.",
    "Tensor parallelism splits each weight matrix across the GPUs of one machine.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828; symbols: {} [] () <> += -> => ;;",
    "Unicode: café, naïve, Straße, 日本語のテキスト, 中文文本, 한국어, Ελληνικά, кириллица, emoji 🙂🚀.",
]


def train_tokenizer(vocab_size: int = 512, corpus: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE tokenizer (every byte is a token, so any text encodes) trained in milliseconds."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((corpus or CORPUS) * 4, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, model_dir: Path, eos_token: str = "<|endoftext|>") -> None:
    """Writes tokenizer.json and a tokenizer_config.json that transformers' AutoTokenizer also reads."""
    tokenizer.save(str(model_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token, "bos_token": None,
              "pad_token": eos_token, "model_max_length": 1 << 20, "chat_template": CHATML_TEMPLATE}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def demo_config(vocab_size: int, eos_token_ids: list[int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False,
        "dtype": "float32", "eos_token_id": eos_token_ids, "bos_token_id": None,
    }


def random_llama_weights(config: dict, seed: int = 0, std: float = 0.02, device: str = "cpu", dtype=None) -> dict:
    """Checkpoint tensors named as Hugging Face names them, drawn from N(0, std); norms are ones. Drawn on
    `device` (a GPU draws a large shape in a fraction of the CPU's time), returned on the CPU in `dtype`
    (default float32). torch is imported here, not above: resolving `--model demo` must not import it."""
    import torch
    dtype = dtype or torch.float32
    generator = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim

    def normal(*shape):
        return (torch.randn(*shape, generator=generator, device=device) * std).to("cpu", dtype)

    def ones(size):
        return torch.ones(size, dtype=dtype)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden),
               "model.norm.weight": ones(hidden), "lm_head.weight": normal(config["vocab_size"], hidden)}
    experts = config.get("num_experts", 0)
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        weights |= {
            prefix + "self_attn.q_proj.weight": normal(q_size, hidden),
            prefix + "self_attn.k_proj.weight": normal(kv_size, hidden),
            prefix + "self_attn.v_proj.weight": normal(kv_size, hidden),
            prefix + "self_attn.o_proj.weight": normal(hidden, q_size),
            prefix + "input_layernorm.weight": ones(hidden),
            prefix + "post_attention_layernorm.weight": ones(hidden),
        }
        if config["model_type"] == "qwen3_moe":
            weights |= {prefix + "self_attn.q_norm.weight": ones(head_dim),
                        prefix + "self_attn.k_norm.weight": ones(head_dim)}
        mlps = [(prefix + "mlp.", inter)]
        if experts and i not in config.get("mlp_only_layers", []):   # Qwen3-MoE's router and experts
            weights[prefix + "mlp.gate.weight"] = normal(experts, hidden)
            mlps = [(f"{prefix}mlp.experts.{e}.", config["moe_intermediate_size"]) for e in range(experts)]
        for mlp, size in mlps:
            weights |= {mlp + "gate_proj.weight": normal(size, hidden), mlp + "up_proj.weight": normal(size, hidden),
                        mlp + "down_proj.weight": normal(hidden, size)}
    return weights


def write_llama_model(model_dir: Path, tokenizer: Tokenizer, **overrides) -> dict:
    """A random-weight Llama folder (config.json, model.safetensors, tokenizer files): the demo model's
    settings with `overrides` (e.g. bigger shapes for a benchmark). Returns the config."""
    eos_ids = [tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|im_end|>")]
    config = demo_config(tokenizer.get_vocab_size(), eos_ids) | overrides
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    from safetensors.torch import save_file
    save_file(random_llama_weights(config), str(model_dir / "model.safetensors"))
    save_tokenizer(tokenizer, model_dir)
    return config


def demo_moe_overrides() -> dict:
    """The MoE demo: the demo Llama's attention, in Qwen3-MoE's layout, with 8 experts of 128 (top-2, renormalized)
    in every layer: 8 divides over 1, 2, 4 or 8 expert-parallel processes."""
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "attention_bias": False}


def build_demo_model(model_dir: Path) -> None:
    write_llama_model(model_dir, train_tokenizer())


def build_demo_moe_model(model_dir: Path) -> None:
    write_llama_model(model_dir, train_tokenizer(), **demo_moe_overrides())


BUILDERS = {DEMO_NAME: build_demo_model, DEMO_MOE_NAME: build_demo_moe_model}


def demo_model_dir(name: str = DEMO_NAME) -> Path:
    """Where `--model demo` (or `demo-moe`) lives: $KUBEINFER_DEMO_MODEL_DIR (the runtime image bakes the demo
    there, and `demo-moe` beside it), else the user's cache directory."""
    if baked := os.environ.get(DEMO_DIR_ENV):
        return Path(baked) if name == DEMO_NAME else Path(baked).with_name(name)
    from kubeinfer.runtime.config import default_cache_dir
    return default_cache_dir() / f"{name}-model-{DEMO_VERSION}"


def resolve_model_dir(model: str) -> Path:
    """`demo` or `demo-moe` -> that demo model's folder (built on first use); `smollm2-135m-instruct` -> the trained
    model's (runtime/trained_models.py); anything else is a folder path."""
    if model == SMOLLM2_NAME:
        return smollm2_dir()
    if model not in BUILDERS:
        return Path(model).expanduser()
    target = demo_model_dir(model)
    if not (target / "model.safetensors").is_file():
        logger.info("building the %s model in %s (once)", model, target)
        try:
            build_into(target, BUILDERS[model])
        except OSError as error:
            raise ConfigError(f"cannot build the {model} model in {target}: {error.strerror or error}; point "
                              f"XDG_CACHE_HOME (or {DEMO_DIR_ENV}) at a writable folder") from error
    return target


def build_into(target: Path, build) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".demo-"))
    try:
        build(staging)
        if target.exists():  # a half-built folder from an interrupted run
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
