"""Sleep and wake: an idle engine gives its memory back and keeps its process, so that waking it costs a copy, not a
cold start (pod, image, interpreter, checkpoint, KV pool, graphs). vLLM's names and levels (docs/runtime.md, "Sleep"):

- level 1: the KV cache is freed and the weights leave the device: to pinned host memory on a GPU; on the CPU, to a
  file (the page cache keeps it while memory allows, and the kernel may drop it under pressure), so the process's
  own memory falls to its code and buffers. Waking copies them back on a GPU; on the CPU it maps the file, each
  weight a view of the mapping (near free; pages come in from the page cache as they are first read).
- level 2: the weights are dropped too. Waking builds the model again from its checkpoint (read, converted, packed)
  and takes the new tensors as they are.

The weights are every parameter and every packed copy of one (`packed`: the CPU GEMM's layout) of the model and of
the draft model. Each is swapped for an empty tensor in its place (a Parameter's `.data`, a module's `packed`), so
whatever holds the Parameter (a tied head holds the embedding's) sees it come back; CUDA graphs, which hold raw
addresses, are dropped and captured again. oneDNN's opaque packed weights (kernels/cpu_linear.py, on a CPU with
AVX-512) are kept as the plain weights they were packed from and packed again at wake, into new memory. The KV
cache's contents are gone after a wake, so the prefix cache is forgotten.
"""
import ctypes
import dataclasses
import math
import mmap
import os
import tempfile
import weakref
from dataclasses import dataclass

import torch

from kubeinfer.kernels.cpu_linear import Panels
from kubeinfer.runtime.cpu_allocator import release_freed_memory
from kubeinfer.runtime.engine.messages import SLEEP_LEVELS
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.layers.embedding import ParallelLMHead
from kubeinfer.runtime.models.weights import (flat_bytes, is_opaque, mapped, named_weights, packed_as,
                                              private_mapping, tensor_of)


@dataclass
class WeightSlot:
    """One weight: `owner.name` (a Parameter's `data`, or a module's `packed`) and what it was."""
    owner: object
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    opaque: bool   # oneDNN's layout: its plain weight's bytes are copied out, and packed again when put back

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def get(self) -> torch.Tensor:
        return tensor_of(getattr(self.owner, self.name))

    def set(self, tensor: torch.Tensor) -> None:
        """Puts `tensor` in place (an opaque slot's plain weight, packed again)."""
        tensor = packed_as(tensor, self.opaque) if tensor.numel() else tensor
        value = getattr(self.owner, self.name)
        setattr(self.owner, self.name, dataclasses.replace(value, data=tensor) if isinstance(value, Panels) else tensor)


def weight_slots(models: list[torch.nn.Module]) -> list[WeightSlot]:
    """The weights of `models` (models/weights.py) that hold memory, in the modules' order."""
    slots = []
    for model in models:
        for _, module, attribute, value in named_weights(model):
            owner, name = (module, "packed") if attribute == "packed" else (value, "data")
            tensor = tensor_of(value)
            if is_opaque(tensor) or tensor.numel():
                slots.append(WeightSlot(owner, name, tuple(tensor.shape), tensor.dtype, is_opaque(tensor)))
    return slots


class WeightStash:
    """Level 1's copy of the weights off the device: pinned host buffers (GPU), or one unlinked file (CPU)."""

    def __init__(self, slots: list[WeightSlot], device: torch.device, directory: str | None):
        self.slots = slots
        self.host: list[torch.Tensor] = []
        self.file = None
        if device.type == "cuda":
            for slot in self.slots:
                self.host.append(torch.empty(slot.nbytes, dtype=torch.uint8, pin_memory=True))
                self.host[-1].copy_(flat_bytes(slot.get()), non_blocking=True)
            torch.cuda.synchronize(device)
            return
        self.file = tempfile.TemporaryFile(dir=directory, prefix="kubeinfer-sleep-")   # unlinked: gone with us
        self.offsets = []
        for slot in self.slots:   # each at a page boundary, so that a mapping of the file can hold it in place
            self.offsets.append(-(-self.file.tell() // mmap.PAGESIZE) * mmap.PAGESIZE)
            self.file.seek(self.offsets[-1])
            self.file.write(memoryview(flat_bytes(slot.get()).numpy()))
        self.file.flush()
        self.size = self.file.tell()

    def holds(self, slots: list[WeightSlot]) -> bool:
        """Whether this copy is of these weights (their places, shapes and types)."""
        kept = [(id(s.owner), s.name, s.shape, s.dtype) for s in self.slots]
        return kept == [(id(s.owner), s.name, s.shape, s.dtype) for s in slots]

    def restore(self, device: torch.device) -> None:
        """Puts every weight back in place: on a GPU in new device memory; on a CPU as views of a private mapping of
        the file (no copy: a page comes in when first read, from the page cache), unless KUBEINFER_SLEEP_WAKE=copy
        asks for a copy into new memory."""
        if self.file is not None and os.environ.get("KUBEINFER_SLEEP_WAKE") != "copy":
            return self._map()
        for index, slot in enumerate(self.slots):
            tensor = torch.empty(slot.shape, dtype=slot.dtype, device=device)
            if self.file is None:
                flat_bytes(tensor).copy_(self.host[index], non_blocking=True)
            else:
                self.file.seek(self.offsets[index])
                if self.file.readinto(memoryview(flat_bytes(tensor).numpy())) != slot.nbytes:
                    raise OSError("the weights' sleep file is shorter than what was written to it")
            slot.set(tensor)

    def _map(self) -> None:
        """Each weight becomes a view of one private mapping of the file (copy-on-write: nothing reaches the file);
        the mapping lives as long as those views, so the next sleep, which swaps them for empty tensors, unmaps it."""
        mapping = private_mapping(self.file.fileno(), self.size)
        for offset, slot in zip(self.offsets, self.slots):
            slot.set(mapped(mapping, offset, slot.shape, slot.dtype))

    def close(self) -> None:
        self.host = []
        if self.file is not None:
            self.file.close()
            self.file = None


def release_kv(kv_cache: torch.Tensor) -> int:
    """Frees a KV pool's memory, its contents lost: a GPU storage shrinks to nothing; a CPU one gives its pages back
    (they read as zeros when touched again). Returns the bytes it held."""
    storage = kv_cache.untyped_storage()
    nbytes = storage.nbytes()
    if storage.device.type != "cpu":
        storage.resize_(0)
        return nbytes
    page = mmap.PAGESIZE
    start = -(-storage.data_ptr() // page) * page   # whole pages inside the pool only
    length = (storage.data_ptr() + nbytes - start) // page * page
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if length > 0 and libc.madvise(start, length, mmap.MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) of the KV cache failed")
    return nbytes


def restore_kv(kv_cache: torch.Tensor, nbytes: int) -> None:
    storage = kv_cache.untyped_storage()
    if storage.nbytes() != nbytes:
        storage.resize_(nbytes)
        torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).zero_()


# A CPU runner's level-1 file after its wake, by runner (put_to_sleep)
_kept_files: "weakref.WeakKeyDictionary[object, WeightStash]" = weakref.WeakKeyDictionary()


@dataclass
class Sleep:
    """What a sleeping runner needs to wake: its level, the weights' slots and stash, the KV pools' sizes."""
    level: int
    slots: list[WeightSlot]
    stash: WeightStash | None
    kv_bytes: list[tuple[torch.Tensor, int]]
    graphs: bool
    freed_bytes: int   # what the device's memory in use fell by (this process's resident memory on the CPU)


def kv_pools(runner) -> list[torch.Tensor]:
    draft = runner.draft
    return [runner.kv_cache] + ([draft.kv_cache] if draft is not None and draft.kv_cache is not None else [])


def check_level(level) -> None:
    if level not in SLEEP_LEVELS:
        raise InvalidRequestError(f"sleep level must be 1 or 2, got {level!r}", "level")


def sleep_at(runner, sleeping: Sleep | None, level: int) -> Sleep:
    """Puts the awake runner (`sleeping` None) to sleep at `level`, or deepens its sleep to it; a lighter level than
    its own changes nothing (`level`: checked by the engine, check_level). Rank 0's runner takes the other ranks
    with it."""
    if sleeping is None:
        return put_to_sleep(runner, level, sleep_directory())
    if level > sleeping.level:
        deepen(sleeping, runner)
    return sleeping


def put_to_sleep(runner, level: int, directory: str | None = None) -> Sleep:
    """Frees the runner's KV cache and moves (level 1) or drops (level 2) its weights (`runner`: a ModelRunner).
    A CPU runner's level-1 file is kept after its wake (weights do not change while serving: the file still holds
    them) and taken again at its next level-1 sleep, which then writes nothing: the second and later sleeps only
    free memory. The kept file's pages are the page cache's, which the kernel reclaims under pressure."""
    if runner.workers is not None:   # the other ranks sleep with this one
        runner.workers.control({"sleep": level})
    models = [runner.model] + ([runner.draft.model] if runner.draft is not None else [])
    slots = weight_slots(models)
    kept = _kept_files.pop(runner, None)
    if kept is not None and (level != 1 or not kept.holds(slots)):
        kept.close()
        kept = None
    stash = (kept or WeightStash(slots, runner.device, directory)) if level == 1 else None
    graphs = runner.cuda_graphs is not None
    runner.cuda_graphs = runner.verify_graphs = None   # they hold the old addresses
    if runner.draft is not None:
        runner.draft.graphs = runner.draft.chunk_graphs = None
    in_use = memory_in_use(runner.device)
    for slot in slots:
        slot.set(torch.empty(0, dtype=slot.dtype, device=runner.device))
    for model in models:   # the LM heads' kept logits buffers (layers/embedding.py)
        for module in model.modules():
            if isinstance(module, ParallelLMHead):
                module.release_output()
    kv_bytes = [(pool, release_kv(pool)) for pool in kv_pools(runner)]
    _release_device_memory(runner.device)
    return Sleep(level, slots, stash, kv_bytes, graphs, max(0, in_use - memory_in_use(runner.device)))


def memory_in_use(device: torch.device) -> int:
    """Bytes in use on the device: the GPU's (all processes'), or this process's resident memory."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total - free
    status = open("/proc/self/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def deepen(sleep: Sleep, runner) -> None:
    """Level 1 to level 2: the stash is dropped (on the other ranks too, from rank 0's `runner`)."""
    if runner.workers is not None:
        runner.workers.control({"sleep": 2})
    if sleep.stash is not None:
        sleep.stash.close()
        sleep.stash = None
    sleep.level = 2


def wake(runner, sleep: Sleep) -> None:
    """Gives the runner back its weights (from the stash, or built again: `runner.build_models()`) and its KV pools,
    and captures its CUDA graphs again if it had them."""
    if runner.workers is not None:
        runner.workers.control({"wake": True})
    for pool, nbytes in sleep.kv_bytes:
        restore_kv(pool, nbytes)
    if sleep.stash is not None:
        sleep.stash.restore(runner.device)
        if sleep.stash.file is not None:
            _kept_files[runner] = sleep.stash   # for the next sleep (put_to_sleep)
        else:
            sleep.stash.close()   # pinned host memory: given back
    else:
        take_from(sleep.slots, weight_slots(runner.build_models()))
    if sleep.graphs:
        runner._capture_graphs(runner.config)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def take_from(slots: list[WeightSlot], fresh: list[WeightSlot]) -> None:
    """Puts a fresh build's weights in the sleeping model's places (its tensors themselves: no copy)."""
    if [(s.shape, s.dtype, s.opaque) for s in slots] != [(s.shape, s.dtype, s.opaque) for s in fresh]:
        raise RuntimeError("the rebuilt model's weights do not match the sleeping one's")
    for slot, new in zip(slots, fresh):
        if slot.opaque:   # already packed
            setattr(slot.owner, slot.name, getattr(new.owner, new.name))
        else:
            slot.set(new.get())


def _release_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        release_freed_memory()


def sleep_directory() -> str | None:
    """Where level 1 writes a CPU engine's weights: KUBEINFER_SLEEP_DIR, else the temporary directory."""
    return os.environ.get("KUBEINFER_SLEEP_DIR") or None
