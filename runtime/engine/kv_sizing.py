"""How much memory the KV cache gets when the user gave no size: a share of the device's memory, less what is in use.

GPU: `gpu_memory_utilization` of the device's memory, less what is already used there (free - (1 - u) * total).
CPU, the same rule over host memory, with `cpu_memory_utilization`: the memory this process may use is its cgroup's
limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) or else the machine's; what is used there is the cgroup's usage
(the API process, the weights just loaded, the page cache it holds) or else what the machine does not have
available. From that share come a margin for one step's activations and logits and, with several engine processes
on the machine (tensor or expert parallelism), each process's part. The default share: 0.9 of a cgroup's limit (a
container's memory is its own, as a GPU's is), 0.5 of a machine's (shared with everything else running there).

The pool is never more than every sequence at full length could use. On the CPU it is allocated lazily
(`lazy_zeros`): pages are committed as blocks are first written, so a large budget costs nothing at start-up.
"""
import math
import mmap
import re
from dataclasses import dataclass
from pathlib import Path

import torch

CGROUP = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
NO_LIMIT = 2**60   # cgroup v1 writes "no limit" as a page-aligned 2**63 - 1
MIN_ACTIVATION_MARGIN = 256 * 2**20
DEDICATED_UTILIZATION, SHARED_UTILIZATION = 0.9, 0.5   # cpu_memory_utilization's default (see above)
# Under the default share, a busy machine (less than the share available) still gets the old fixed pool where that
# much is free, rather than an engine that refuses to start. A share the user set is taken as set.
CPU_FLOOR = 2**29


@dataclass(frozen=True)
class HostMemory:
    limit: int       # bytes this process may use: the cgroup's limit, else the machine's total
    available: int   # bytes of that not in use now
    source: str      # where the limit came from, for the log line
    dedicated: bool = False   # a cgroup's limit: memory this container alone uses


def read_host_memory(cgroup: Path = CGROUP, meminfo: Path = MEMINFO) -> HostMemory:
    """The machine's memory, narrowed by the cgroup's limit when it has a lower one."""
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB", meminfo.read_text(), re.MULTILINE))
    total, available = int(fields["MemTotal"]) * 1024, int(fields["MemAvailable"]) * 1024
    limited = _cgroup_limit_and_usage(cgroup)
    if limited is None or limited[0] >= total:
        return HostMemory(total, available, "the machine's memory")
    limit, usage = limited
    return HostMemory(limit, max(0, min(limit - usage, available)), "the cgroup's memory limit", dedicated=True)


def _cgroup_limit_and_usage(root: Path) -> tuple[int, int] | None:
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit_text, usage = (root / limit_file).read_text().strip(), int((root / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= NO_LIMIT:
            return None
        return int(limit_text), usage
    return None


def activation_margin(num_tokens: int, num_seqs: int, hidden_size: int, intermediate_size: int, vocab_size: int,
                      dtype_bytes: int) -> int:
    """Bytes a step's activations may hold at once, with room to spare: the widest layer's input and output over a
    full step's tokens (the MLP's gate and up halves, its product, the residual stream) and the logits of every
    sequence in fp32 (raw, processed, probabilities)."""
    per_token = (4 * hidden_size + 3 * intermediate_size) * dtype_bytes
    logits = 3 * num_seqs * vocab_size * 4
    return max(MIN_ACTIVATION_MARGIN, 2 * (num_tokens * per_token + logits))


def cpu_kv_budget(memory: HostMemory, utilization: float, margin: int, num_processes: int = 1) -> int:
    """Bytes of KV cache for each of `num_processes` engine processes: `utilization` of the limit, less what is in
    use and the activations' margin (the same rule as a GPU's free - (1 - u) * total)."""
    budget = memory.available - (1 - utilization) * memory.limit - margin
    return max(0, int(budget // num_processes))


def kv_budget(config, device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """Bytes for the KV cache of one engine process (`config`: its EngineConfig), and where they came from."""
    if config.kv_cache_memory_gib is not None:
        return config.kv_cache_memory_gib * 2**30, "--kv-cache-memory-gib"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        utilization = config.gpu_memory_utilization
        return free - (1 - utilization) * total, f"gpu_memory_utilization {utilization:g}"
    model = config.model_config
    memory = read_host_memory()
    margin = activation_margin(config.max_num_batched_tokens, config.max_num_seqs, model.hidden_size,
                               model.intermediate_size, model.vocab_size, dtype.itemsize)
    utilization = config.cpu_memory_utilization or (DEDICATED_UTILIZATION if memory.dedicated else SHARED_UTILIZATION)
    budget = cpu_kv_budget(memory, utilization, margin, config.world_size)
    source = f"cpu_memory_utilization {utilization:g} of {memory.limit / 2**30:.1f} GiB, {memory.source}"
    floor = min(CPU_FLOOR, (memory.available - margin) // config.world_size)
    if config.cpu_memory_utilization is None and budget < floor:
        return floor, f"{source}: {budget / 2**30:.2f} GiB by that rule, raised to the {CPU_FLOOR / 2**30:g} GiB floor"
    return budget, source


def num_kv_blocks(config, block_bytes: int, device: torch.device, dtype: torch.dtype) -> tuple[int, str]:
    """KV blocks of `block_bytes` for one engine process, and where their number came from (for the log line)."""
    if config.num_kvcache_blocks is not None:
        return config.num_kvcache_blocks, "--num-kvcache-blocks"
    budget, source = kv_budget(config, device, dtype)
    most = config.max_num_seqs * config.max_blocks_per_seq + 1   # never more than every sequence at full length uses
    num_blocks = min(int(budget // block_bytes), most)
    if num_blocks < 1:
        raise MemoryError(f"no memory left for the KV cache (budget {budget / 2**30:.2f} GiB, {source})")
    return num_blocks, source


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, prefault: bool = False) -> torch.Tensor:
    """A zeroed CPU tensor on anonymous memory: the kernel commits (and zeroes) each page when it is first touched,
    so a pool sized for the whole budget takes memory as it fills, not at start-up. `prefault`: every page touched
    now (written with zeros, by torch's threads), so that no step pays a page's first touch later; where memory
    behind a VM is backed lazily that touch ran at ~1 GB/s (docs/runtime.md, `--kv-prefault`)."""
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):   # fewer TLB misses when attention walks a large pool
        buffer.madvise(mmap.MADV_HUGEPAGE)
    pool = torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)
    return pool.zero_() if prefault else pool
