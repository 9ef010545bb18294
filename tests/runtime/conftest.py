"""Tiny random-weight models of each supported architecture, built offline with transformers."""
import json
from pathlib import Path

import pytest
import torch

from kubeinfer.runtime.demo import save_tokenizer, train_tokenizer
from support.trained_model import smollm2  # noqa: F401  (a real trained model, for test_trained_model.py)

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]
MOE_ARCHS = ["mixtral", "qwen2moe", "qwen3moe"]


def _hf_config(arch: str, vocab_size: int, eos_id: int):
    import transformers as tf
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512, rms_norm_eps=1e-5,
                  eos_token_id=eos_id, bos_token_id=None, pad_token_id=None)
    if arch == "llama":
        return tf.LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=False)
    if arch == "llama3":   # Llama 3 rope scaling, tied embeddings, one KV head for four query heads
        return tf.LlamaConfig(**common, num_key_value_heads=1, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 64})
    if arch == "mistral":  # a window shorter than the test prompts, so it matters
        return tf.MistralConfig(**common, num_key_value_heads=2, sliding_window=12, tie_word_embeddings=False)
    if arch == "qwen2":
        return tf.Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=True)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
    moe = dict(common, num_hidden_layers=3, num_key_value_heads=2, num_experts_per_tok=2)
    if arch == "mixtral":   # 8 experts of 48, top-2 renormalized, a window shorter than the prompts
        return tf.MixtralConfig(**dict(moe, intermediate_size=48), num_local_experts=8, sliding_window=12,
                                tie_word_embeddings=False)
    if arch == "qwen2moe":   # a shared expert behind its sigmoid gate; top-k weights not renormalized
        return tf.Qwen2MoeConfig(**moe, num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=96,
                                 norm_topk_prob=False, tie_word_embeddings=True)
    if arch == "qwen3moe":   # layer 1 dense among sparse ones (mlp_only_layers), q/k norms, renormalized top-k
        return tf.Qwen3MoeConfig(**moe, num_experts=8, moe_intermediate_size=32, head_dim=32, mlp_only_layers=[1],
                                 norm_topk_prob=True, tie_word_embeddings=False)
    raise ValueError(arch)


def build_hf_model(arch: str, path: Path, seed: int = 0) -> Path:
    """Saves a random model and our byte-level BPE tokenizer to `path`. Biases and norm weights are random
    too (transformers initialises them to 0 and 1), so loading them is tested."""
    import transformers as tf
    tokenizer = train_tokenizer(vocab_size=384)
    eos_id = tokenizer.token_to_id("<|endoftext|>")
    config = _hf_config(arch, tokenizer.get_vocab_size(), eos_id)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
            elif "norm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: build_hf_model(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def moe_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-models")
    return {arch: build_hf_model(arch, root / arch) for arch in MOE_ARCHS}


@pytest.fixture(scope="session")
def llama_dir(model_dirs) -> Path:
    return model_dirs["llama"]


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
