"""The checkpoint reader puts exactly the checkpoint's numbers into the parameters, reading into them directly.

The reference is safetensors' own parser (`load_file`): with one rank each parameter is assembled by hand
from it (q, k, v and gate, up concatenated); with several ranks (the process group faked, only the shapes
and shard offsets depend on it) the same weight loaders are fed safetensors' tensors instead of our reader.
"""
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from kubeinfer.runtime.errors import ModelLoadError
from kubeinfer.runtime.models import checkpoint, loader
from kubeinfer.runtime.models.config import ModelConfig
from kubeinfer.runtime.models.registry import MODEL_CLASSES

PACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
ODD_VOCAB = 387   # the tokenizer has 384 tokens; 387 splits over neither 2 nor 4 ranks


def build(model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    config = ModelConfig.from_dir(model_dir)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = MODEL_CLASSES[config.architecture](config, 64)
    finally:
        torch.set_default_dtype(default)
    for param in model.parameters():   # garbage, so a tensor the loader skips cannot pass by luck
        param.data.fill_(float("nan") if param.dtype.is_floating_point else 7)
    return model


def expected_one_rank(model_dir: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors |= load_file(file)
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        target, order = name, 0
        for part, (fused, position) in PACKED.items():
            if f".{part}." in name:
                target, order = name.replace(f".{part}.", f".{fused}."), position
        parts.setdefault(target, {})[order] = tensor
    expected = {name: torch.cat([p[i] for i in sorted(p)]) for name, p in parts.items()}
    params = dict(model.named_parameters())
    if "lm_head.weight" in params and "lm_head.weight" not in expected:   # tied
        expected["lm_head.weight"] = expected["model.embed_tokens.weight"]
    return {name: tensor for name, tensor in expected.items() if name in params}


def to_dtype(src: Path, dst: Path, dtype: torch.dtype, num_files: int = 1) -> Path:
    """A copy of a model folder with its weights in `dtype`, spread over `num_files` safetensors files."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    tensors = {}
    for file in src.glob("*.safetensors"):
        tensors |= {name: t.to(dtype) for name, t in load_file(file).items()}
    names = sorted(tensors)
    for i in range(num_files):
        save_file({n: tensors[n] for n in names[i::num_files]}, str(dst / f"model-{i:05d}-of-{num_files:05d}.safetensors"))
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "dtype": str(dtype).removeprefix("torch.")}))
    return dst


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3"])
def test_every_parameter_equals_the_checkpoint(model_dirs, arch):
    model = build(model_dirs[arch], torch.float32)
    loader.load_weights(model, model_dirs[arch])
    expected = expected_one_rank(model_dirs[arch], model)
    assert set(expected) == {n for n, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        assert torch.equal(param, expected[name]), name


@pytest.mark.parametrize("model_dtype", [torch.bfloat16, torch.float32])
def test_bf16_sharded_checkpoint_in_chunks_and_threads(model_dirs, tmp_path, monkeypatch, model_dtype):
    """A bf16 checkpoint over three files, read in 1000-byte chunks (not a multiple of a row) on 1 and on 3
    threads, into a bf16 model (straight in) and a float32 one (converted)."""
    source = to_dtype(model_dirs["qwen2"], tmp_path / "bf16", torch.bfloat16, num_files=3)
    monkeypatch.setattr(checkpoint, "CHUNK_BYTES", 1000)
    for threads in (1, 3):
        monkeypatch.setattr(checkpoint, "NUM_READ_THREADS", threads)
        model = build(source, model_dtype)
        loader.load_weights(model, source)
        expected = expected_one_rank(source, model)
        for name, param in model.named_parameters():
            assert param.dtype == model_dtype
            assert torch.equal(param, expected[name].to(model_dtype)), (threads, name)


def test_same_dtype_reads_into_the_parameters_without_an_intermediate_tensor(model_dirs, tmp_path, monkeypatch):
    source = to_dtype(model_dirs["llama"], tmp_path / "bf16", torch.bfloat16)
    intermediates = []
    monkeypatch.setattr(checkpoint.TensorSource, "__getitem__", lambda self, index: intermediates.append(self.name))
    model = build(source, torch.bfloat16)
    loader.load_weights(model, source)
    assert intermediates == []
    expected = expected_one_rank(source, model)
    assert all(torch.equal(p, expected[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_reads_its_shards_as_from_safetensors(odd_vocab_or_qwen2, monkeypatch, tp):
    """Our reader against safetensors' tensors through the same weight loaders, rank by rank (vocabulary
    padding, replicated KV heads, biases, column shards of row-parallel layers)."""
    model_dir = odd_vocab_or_qwen2
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: tp)
    tensors = load_file(next(model_dir.glob("*.safetensors")))
    for rank in range(tp):
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
        ours, reference = build(model_dir, torch.float32), build(model_dir, torch.float32)
        loader.load_weights(ours, model_dir)
        params = dict(reference.named_parameters())
        with torch.no_grad():
            for name, tensor in tensors.items():
                target, shard = loader._map_name(name, reference.packed_modules)
                if target in params:
                    getattr(params[target], "weight_loader", loader._load_whole)(params[target], tensor, shard)
        for name, param in ours.named_parameters():
            assert torch.equal(param, params[name]), (rank, name)


@pytest.fixture(params=["llama3, odd vocabulary", "qwen2"])
def odd_vocab_or_qwen2(request, model_dirs, tmp_path):
    """qwen2 (biases) or llama3 (one KV head for four query heads, tied embeddings) with its embedding grown to
    ODD_VOCAB rows."""
    if request.param == "qwen2":
        return model_dirs["qwen2"]
    model_dir = to_dtype(model_dirs["llama3"], tmp_path / "odd", torch.float32)
    [weights] = model_dir.glob("*.safetensors")
    tensors = load_file(weights)
    embed = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = torch.cat([embed, torch.randn(ODD_VOCAB - len(embed), embed.shape[1])])
    save_file(tensors, str(weights))
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": ODD_VOCAB}))
    return model_dir


def test_damaged_files_are_refused_with_the_file_named(model_dirs, tmp_path):
    model_dir = shutil.copytree(model_dirs["llama"], tmp_path / "m")
    [weights] = model_dir.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    with pytest.raises(ModelLoadError, match=r"model.safetensors: tensor .* \(truncated file\?\)"):
        loader.load_weights(build(model_dir, torch.float32), model_dir)
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + data[24:])
    with pytest.raises(ModelLoadError, match="model.safetensors: not a safetensors file"):
        loader.load_weights(build(model_dir, torch.float32), model_dir)
    weights.write_bytes(b"\x01\x02")
    with pytest.raises(ModelLoadError, match=r"not a safetensors file \(2 bytes\)"):
        loader.load_weights(build(model_dir, torch.float32), model_dir)
