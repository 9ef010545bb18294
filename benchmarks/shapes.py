"""Real model shapes for every speed benchmark: the configs of models users run, with random weights.

Each shape is the `config.json` of the real model (layers, widths, heads, vocabulary, tied embeddings, rope, qkv
bias); `write_shape_dir` writes it beside the demo's byte-level tokenizer, and the engines load it with
`load_format="dummy"` (random weights of the shape, nothing written or read: ours N(0, 0.02), vLLM's its own), so a
1B shape costs no checkpoint on disk. Token ids past the tokenizer's vocabulary decode to '': the benchmarks send
token ids, so speed is the model's. Greedy outputs of two engines on dummy weights are not comparable (each draws
its own); `--model smollm2-135m-instruct` runs the real trained model of the first shape instead.

- `smollm2-135m`: SmolLM2-135M(-Instruct): 30 layers, hidden 576, 9 / 3 heads of 64, vocabulary 49,152, tied.
- `qwen2.5-0.5b`: Qwen2.5-0.5B: 24 layers, hidden 896, 14 / 2 heads of 64, vocabulary 151,936, qkv bias, tied.
- `llama-3.2-1b`: Llama-3.2-1B: 16 layers, hidden 2,048, 32 / 8 heads of 64, vocabulary 128,256, tied, llama3 rope.
- `llama-3.1-8b`: Llama-3.1-8B (the GPU shape): 32 layers, hidden 4,096, 32 / 8 heads of 128, vocabulary 128,256.
- `toy`: the first benchmarks' random Llama (hidden 512, 4 layers, vocabulary 1,024): a fast smoke option, never a
  headline figure. `tiny`: smaller still, for the scripts' own smoke tests.
"""
import json
from pathlib import Path

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA31_ROPE = LLAMA3_ROPE | {"factor": 8.0}

SHAPES = {
    "smollm2-135m": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
                         dtype="bfloat16"),
    "qwen2.5-0.5b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         head_dim=64, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
                         use_sliding_window=False, dtype="bfloat16"),
    "llama-3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True, dtype="bfloat16"),
    "llama-3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_parameters=LLAMA31_ROPE, tie_word_embeddings=False, dtype="bfloat16"),
    "toy": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=512, intermediate_size=1365,
                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=1024,
                max_position_embeddings=4096, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                dtype="float32"),
    "tiny": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, intermediate_size=256,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1024,
                 max_position_embeddings=1024, rms_norm_eps=1e-5,
                 rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 256}, tie_word_embeddings=False,
                 dtype="float32"),
}
# The GPU scripts' older names for the same shapes.
SHAPES["8b"], SHAPES["1b"] = SHAPES["llama-3.1-8b"], SHAPES["llama-3.2-1b"]
CPU_SHAPES = ("smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b")   # the CPU benchmarks' real shapes, smallest first


def write_shape_dir(path: Path, shape: dict | str) -> Path:
    """A model folder of the shape (config.json and the demo's tokenizer), to load with `load_format="dummy"`."""
    from kubeinfer.runtime.demo import save_tokenizer, train_tokenizer
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    path.mkdir(parents=True, exist_ok=True)
    config = {"eos_token_id": None, "bos_token_id": None, **shape}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(train_tokenizer(), path)
    return path


def model_folder(tmp: Path, shape: str, model: str | None) -> tuple[Path, str]:
    """The folder a benchmark runs and its load format: `model` (a folder or a name such as smollm2-135m-instruct) as
    it is, else the shape's folder under `tmp`, with dummy weights."""
    if model is not None:
        from kubeinfer.runtime.demo import resolve_model_dir
        return resolve_model_dir(model), "auto"
    return write_shape_dir(tmp / shape, shape), "dummy"


def describe(name: str) -> str:
    shape = SHAPES[name]
    return (f"{name} ({shape['architectures'][0]}: {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
            f"intermediate {shape['intermediate_size']}, {shape['num_attention_heads']}/{shape['num_key_value_heads']} "
            f"heads of {shape['head_dim']}, vocabulary {shape['vocab_size']:,}"
            f"{', tied' if shape['tie_word_embeddings'] else ''}, random weights)")
