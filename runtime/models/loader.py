"""Loads a Hugging Face safetensors checkpoint into our modules, each rank reading only its shards, straight
into the parameters (runtime/models/checkpoint.py)."""
import logging
import re
import sys
from pathlib import Path

import torch
from torch import nn

from kubeinfer.runtime.errors import ModelLoadError
from kubeinfer.runtime.layers.fused_moe import EXPERT_PROJECTIONS
from kubeinfer.runtime.layers.linear import load_rows
from kubeinfer.runtime.models.checkpoint import CheckpointReader

logger = logging.getLogger(__name__)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
RENAMED_PARTS = {".block_sparse_moe.": ".mlp."}   # Mixtral's MoE block, named as Qwen's
EXPERT_TENSOR = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def load_weights(model: nn.Module, model_dir: str | Path) -> None:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors weight files")
    params = dict(model.named_parameters())
    packed = getattr(model, "packed_modules", {})
    expected = {(name, shard) for name, shard in _expected_shards(params, packed)}
    loaded: set[tuple[str, object]] = set()
    progress = _Progress(len(files))
    with torch.no_grad(), CheckpointReader() as reader:
        for index, file in enumerate(files):
            checkpoint = reader.open(file)
            for name, source in checkpoint.tensors.items():
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                target, shard = _map_name(name, packed)
                param = params.get(target)
                if param is None:
                    if name == "lm_head.weight" and "lm_head.weight" not in params:
                        continue  # tied to the embedding
                    logger.warning("checkpoint tensor %s has no place in the model; skipped", name)
                    continue
                loader = getattr(param, "weight_loader", _load_whole)
                try:
                    loader(param, source, shard)
                except ValueError as error:
                    raise ModelLoadError(f"{file.name}: {name}: {error}") from error
                loaded.add((target, shard))
            progress.update(index + 1, len(loaded), len(expected))   # queued; the reads finish below
        try:
            reader.wait()
        except OSError as error:
            raise ModelLoadError(f"{model_dir}: reading the weights failed: {error}") from error
    missing = sorted(f"{name}{'' if shard is None else f' [{shard}]'}" for name, shard in expected - loaded)
    if missing:
        raise ModelLoadError(f"{model_dir}: weights missing from the checkpoint: {', '.join(missing[:8])}"
                             + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights in place of a checkpoint (`load_format="dummy"`), for benchmarks of large shapes without
    writing or reading one: matrices ~ N(0, 0.02), norm weights 1, biases 0 (Hugging Face's initialisation)."""
    generator = None
    for name, param in model.named_parameters():
        if generator is None:
            generator = torch.Generator(device=param.device).manual_seed(seed)
        if "norm" in name:
            param.fill_(1.0)
        elif name.endswith("bias"):
            param.zero_()
        else:
            param.normal_(0.0, 0.02, generator=generator)


def _load_whole(param, source, shard_id=None) -> None:
    load_rows(param.data, source, None, "checkpoint tensor")


def _map_name(name: str, packed: dict[str, tuple[str, object]]) -> tuple[str, object]:
    for old, new in RENAMED_PARTS.items():
        name = name.replace(old, new)
    expert = EXPERT_TENSOR.match(name)   # one expert's projection -> the grouped parameter, (expert, part)
    if expert and expert.group(3) in EXPERT_PROJECTIONS:
        target, part = EXPERT_PROJECTIONS[expert.group(3)]
        return f"{expert.group(1)}.{target}", (int(expert.group(2)), part)
    for checkpoint_part, (our_part, shard) in packed.items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{our_part}."), shard
    return name, None


def _expected_shards(params: dict[str, nn.Parameter], packed: dict[str, tuple[str, object]]):
    shards_of: dict[str, list[object]] = {}
    for our_part, shard in packed.values():
        shards_of.setdefault(our_part, []).append(shard)
    for name, param in params.items():
        if hasattr(param, "checkpoint_shards"):   # a grouped parameter says which tensors fill it
            yield from ((name, shard) for shard in param.checkpoint_shards)
            continue
        part = next((p for p in shards_of if f".{p}." in name), None)
        for shard in shards_of[part] if part else [None]:
            yield name, shard


class _Progress:
    """One line on a terminal (rewritten in place), one log line per file otherwise."""

    def __init__(self, num_files: int):
        self.num_files = num_files
        self.tty = sys.stderr.isatty()

    def update(self, files_done: int, tensors_done: int, tensors_total: int) -> None:
        line = f"loading weights: {files_done}/{self.num_files} files, {tensors_done}/{tensors_total} tensors"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if files_done == self.num_files else ""))
            sys.stderr.flush()
        else:
            logger.info(line)


def build_model(model_config, model_dir: str, max_model_len: int, dtype: torch.dtype, device: torch.device,
                dummy_seed: int | None = None, load: bool = True) -> torch.nn.Module:
    """The model of `model_config` on `device`, its weights read from `model_dir` (or random, given a seed; or only
    allocated, without `load`)."""
    from kubeinfer.runtime.models.registry import MODEL_CLASSES
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = MODEL_CLASSES[model_config.architecture](model_config, max_model_len)
    finally:
        torch.set_default_dtype(default_dtype)
    if load and dummy_seed is not None:
        init_dummy_weights(model, dummy_seed)
    elif load:
        load_weights(model, model_dir)
    return model.eval()
