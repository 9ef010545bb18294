"""The node's weight cache (`--weight-cache-dir`, docs/runtime.md "Weight cache"): a model as the engine holds it
(converted to the serving dtype, sharded for its rank, packed for the CPU GEMM) in one file, so that a new engine
process on the node loads a model it has seen without reading its checkpoint and converting it again.

One file per key: the key hashes what the bytes depend on (the checkpoint's files, sizes and modification times,
the dtype, the device kind, the rank and world size, the kernel backend and the CPU GEMM's layout, this format).
The file: a magic line, the length and JSON of a manifest (each weight's module, attribute, shape, dtype, offset),
then the weights' bytes at 4 KiB-aligned offsets. It is written once, after a load from the checkpoint, under a
temporary name and then renamed, so that a reader never sees half a file (nor a mapped one change: an engine on the
CPU maps the file and uses its weights in place, but for oneDNN's packed ones: the file holds their plain
weights, packed again into new memory at load); one that does not fit the model (another version, a truncated
disk) is ignored with a warning and written again. Nothing evicts entries: a model's files stay until the directory
is cleared (the operator's volume: docs/operator.md).
"""
import hashlib
import json
import logging
import os
import struct
import time
from pathlib import Path

import torch

from kubeinfer.kernels.cpu_linear import Panels, layout_key
from kubeinfer.runtime.models.weights import (flat_bytes, is_opaque, mapped, named_weights, packed_as,
                                              private_mapping, tensor_of)
from kubeinfer.runtime.parallel import world_size

logger = logging.getLogger(__name__)
FORMAT = 1
MAGIC = b"kubeinfer-weights\n"
ALIGN = 4096


def cache_key(config, dtype: torch.dtype, device: torch.device, rank: int, world: int, packing: str) -> str:
    """What a cached model's bytes depend on, hashed. `packing`: the CPU GEMM's layout (kernels/cpu_linear.py)."""
    folder = Path(config.model).resolve()
    files = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" or p.name == "config.json")
    stamp = {"format": FORMAT, "folder": str(folder), "dtype": str(dtype), "device": device.type, "rank": rank,
             "world": world, "layout": packing, "backend": config.kernel_backend, "torch": torch.__version__,
             "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]}
    return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:32]


def save(model: torch.nn.Module, path: Path) -> int:
    """Writes `model`'s weights to `path` (a oneDNN-packed one as its plain weight); returns their bytes."""
    entries, tensors, offset = [], [], 0
    for module, _, attribute, value in named_weights(model):
        tensor = tensor_of(value)
        entry = {"module": module, "attribute": attribute, "shape": list(tensor.shape),
                 "dtype": str(tensor.dtype).removeprefix("torch."), "offset": offset}
        if isinstance(value, Panels):
            entry["panels"] = [value.out_features, value.in_features]
        if is_opaque(tensor):
            entry["onednn"] = True
        entries.append(entry)
        tensors.append(tensor)
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    manifest = json.dumps({"entries": entries, "bytes": offset}).encode()
    header = MAGIC + struct.pack("<Q", len(manifest)) + manifest
    start = -(-len(header) // ALIGN) * ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as file:
        file.write(header)
        for entry, tensor in zip(entries, tensors):
            file.seek(start + entry["offset"])
            if tensor.numel():
                file.write(memoryview(flat_bytes(tensor).cpu().numpy()))
        file.truncate(start + offset)
    partial.rename(path)
    return offset


def load(model: torch.nn.Module, path: Path, device: torch.device) -> None:
    """Puts the weights saved at `path` into `model` (built, its weights not loaded); ValueError if they do not fit.
    On a CPU each weight is a view of one private mapping of the file (nothing is copied: a page comes in from the
    page cache when first read, and engines on the node that map one file share its pages) unless
    KUBEINFER_WEIGHT_CACHE_READ=copy asks for a copy into new memory; on a GPU each is read and copied over."""
    modules = dict(model.named_modules())
    expected = {(module, attribute) for module, _, attribute, _ in named_weights(model) if attribute != "packed"}
    with open(path, "rb") as file:
        if file.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a kubeinfer weight file")
        manifest = json.loads(file.read(struct.unpack("<Q", file.read(8))[0]))
        start = -(-file.tell() // ALIGN) * ALIGN
        if os.fstat(file.fileno()).st_size != start + manifest["bytes"]:
            raise ValueError("its size is not what its manifest says (a write cut short?)")
        if {(e["module"], e["attribute"]) for e in manifest["entries"] if e["attribute"] != "packed"} != expected:
            raise ValueError("its weights are not this model's")
        in_place = device.type == "cpu" and os.environ.get("KUBEINFER_WEIGHT_CACHE_READ") != "copy"
        mapping = private_mapping(file.fileno()) if in_place else None
        for entry in manifest["entries"]:
            tensor = torch.empty(entry["shape"], dtype=getattr(torch, entry["dtype"]))
            if tensor.numel() and mapping is not None:
                tensor = mapped(mapping, start + entry["offset"], entry["shape"], tensor.dtype)
            elif tensor.numel():
                file.seek(start + entry["offset"])
                file.readinto(memoryview(flat_bytes(tensor).numpy()))
            tensor = packed_as(tensor.to(device), entry.get("onednn", False))   # oneDNN's: a copy, packed
            module = modules[entry["module"]]
            if entry["attribute"] == "packed":
                module.packed = Panels(tensor, *entry["panels"]) if "panels" in entry else tensor
            else:
                module._parameters[entry["attribute"].removeprefix("param:")].data = tensor


def load_or_build(config, dtype: torch.dtype, device: torch.device, rank: int, build) -> torch.nn.Module:
    """The model from the cache in `config.weight_cache_dir` when it holds it, else `build()` (then saved there).
    `build(load=False)`: the model with its weights allocated, not loaded."""
    if config.weight_cache_dir is None or config.load_format == "dummy":
        return build()
    key = cache_key(config, dtype, device, rank, world_size(), layout_key())
    path = Path(config.weight_cache_dir) / f"{key}.weights"
    if path.is_file():
        started = time.monotonic()
        model = build(load=False)
        try:
            load(model, path, device)
            logger.info("weights from the node's cache %s in %.2f s", path, time.monotonic() - started)
            return model
        except (OSError, ValueError, KeyError) as error:
            logger.warning("the weight cache %s is not usable (%s): loading the checkpoint and writing it again",
                           path, error)
            del model
    model = build()
    started = time.monotonic()
    try:
        written = save(model, path)
    except OSError as error:
        logger.warning("could not write the weight cache %s: %s", path, error)
        return model
    logger.info("weights written to the node's cache %s (%.0f MiB in %.2f s)", path, written / 2**20,
                time.monotonic() - started)
    return model
