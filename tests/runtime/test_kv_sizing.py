"""The KV cache's default size on the CPU (runtime/engine/kv_sizing.py): a share of the memory the process may use
(its cgroup's limit or the machine's) less what is in use and a step's margin; the pool committed as it fills."""
import logging
import ctypes
import mmap
import resource

import pytest
import torch

from kubeinfer.operator.reconcile.pod import kv_cache_memory_gib
from kubeinfer.operator.spec import parse_spec
from kubeinfer.runtime.engine import kv_sizing
from kubeinfer.runtime.engine.kv_sizing import HostMemory, cpu_kv_budget, read_host_memory
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

GIB = 2**30


def meminfo(tmp_path, total_gib: float, available_gib: float):
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {int(total_gib * 2**20)} kB\nMemFree:         1000 kB\n"
                    f"MemAvailable:   {int(available_gib * 2**20)} kB\n")
    return path


def test_without_a_cgroup_limit_the_machine_is_the_limit(tmp_path):
    memory = read_host_memory(tmp_path / "no-cgroup", meminfo(tmp_path, 24, 20))
    assert memory == HostMemory(24 * GIB, 20 * GIB, "the machine's memory")


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_a_cgroup_limit_below_the_machine_narrows_it(tmp_path, layout):
    root = tmp_path / "cgroup"
    if layout == "v2":
        root.mkdir()
        (root / "memory.max").write_text(f"{8 * GIB}\n")
        (root / "memory.current").write_text(f"{3 * GIB}\n")
    else:
        (root / "memory").mkdir(parents=True)
        (root / "memory" / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
        (root / "memory" / "memory.usage_in_bytes").write_text(f"{3 * GIB}\n")
    memory = read_host_memory(root, meminfo(tmp_path, 24, 20))
    assert memory == HostMemory(8 * GIB, 5 * GIB, "the cgroup's memory limit", dedicated=True)
    # ...and never more available than the machine has free.
    assert read_host_memory(root, meminfo(tmp_path, 24, 2)).available == 2 * GIB


@pytest.mark.parametrize("unlimited", ["max", str(2**63 - 4096)])
def test_an_unlimited_cgroup_reads_as_none(tmp_path, unlimited):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(unlimited)
    (root / "memory.current").write_text(str(GIB))
    assert read_host_memory(root, meminfo(tmp_path, 24, 20)).source == "the machine's memory"


def test_the_budget_is_the_gpu_rule_over_host_memory():
    memory = HostMemory(limit=16 * GIB, available=12 * GIB, source="")
    # 12 available - (1 - 0.5) * 16 - 1 margin = 3 GiB; split over 2 processes on the machine.
    assert cpu_kv_budget(memory, 0.5, GIB) == 3 * GIB
    assert cpu_kv_budget(memory, 0.5, GIB, num_processes=2) == 1.5 * GIB
    assert cpu_kv_budget(memory, 0.9, GIB) == pytest.approx(9.4 * GIB, rel=1e-9)
    assert cpu_kv_budget(HostMemory(16 * GIB, 4 * GIB, ""), 0.5, GIB) == 0   # nothing left: never negative


def test_the_margin_grows_with_the_step_and_the_vocabulary():
    small = kv_sizing.activation_margin(64, 8, 256, 688, 512, 4)
    assert small == kv_sizing.MIN_ACTIVATION_MARGIN
    wide = kv_sizing.activation_margin(2048, 256, 896, 4864, 151936, 4)
    assert wide == 2 * (2048 * (4 * 896 + 3 * 4864) * 4 + 3 * 256 * 151936 * 4) > 900 * 2**20


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lazy_zeros_are_zeros_and_commit_as_they_are_written(dtype):
    shape = (2, 3, 512, 16, 4, 64)   # 48 MiB of fp32
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pool = kv_sizing.lazy_zeros(shape, dtype)
    assert pool.shape == shape and pool.dtype == dtype and pool.is_contiguous()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 100   # nothing touched yet
    assert not pool[1, 2, 511].any() and not pool[0, 0, 0].any()
    pool[1, 2, 511] = 1.5
    assert float(pool[1, 2, 511].float().mean()) == 1.5 and float(pool.float().sum()) == 1.5 * 16 * 4 * 64


def test_a_prefaulted_pool_is_committed_at_once_and_still_zeros():
    shape = (2, 3, 512, 16, 4, 64)   # 48 MiB of fp32: 12,288 pages of 4 KiB (24 huge pages where the kernel gives them)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pool = kv_sizing.lazy_zeros(shape, torch.float32, prefault=True)
    faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faulted >= 24 and not pool.any()   # touched now, by the allocation itself
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pool[1, 2, 511] = 1.5
    pool[0, 0, 0] = 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 8   # a block's first write faults no more
    assert float(pool.sum()) == (1.5 + 2.0) * 16 * 4 * 64


def resident_share(tensor: torch.Tensor) -> float:
    """The share of `tensor`'s pages that are in memory (mincore)."""
    page = mmap.PAGESIZE
    start = tensor.data_ptr() // page * page
    length = tensor.data_ptr() + tensor.numel() * tensor.element_size() - start
    pages = (length + page - 1) // page
    flags = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(start, length, flags) == 0, ctypes.get_errno()
    return sum(flag & 1 for flag in flags) / pages


@pytest.mark.parametrize("prefault", [False, True])
def test_the_engine_prefaults_its_pool_only_when_asked(llama_dir, prefault):
    with LLM(str(llama_dir), max_model_len=512, max_num_seqs=256, kv_cache_memory_gib=0.25,
             kv_prefault=prefault) as llm:
        llm.generate(["a short prompt"], SamplingParams(max_tokens=2))
        share = resident_share(llm.engine.model_runner.kv_cache)
    assert share == 1.0 if prefault else share < 0.5, share


def test_the_engine_sizes_its_cache_from_host_memory_and_says_so(llama_dir, caplog):
    memory = read_host_memory()
    with caplog.at_level(logging.INFO, logger="kubeinfer.runtime.engine.model_runner"):
        llm = LLM(str(llama_dir), max_model_len=256, max_num_seqs=4, cpu_memory_utilization=0.5)
    runner = llm.engine.model_runner
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache:"))
    assert "cpu_memory_utilization 0.5" in line and "sequences of max_model_len 256" in line
    # Capped at every sequence at full length (4 x 256 tokens), the budget being far larger on any test machine.
    assert runner.num_blocks == 4 * 256 // llm.engine.config.block_size + 1, line
    assert memory.available - 0.5 * memory.limit > 64 * 2**20
    llm.shutdown()


def test_the_operators_quarter_of_a_pods_memory_fits_in_what_the_runtime_would_take():
    """A CPU pod gets an explicit KV budget (a quarter of its memory per process); the runtime's own rule, in a cgroup
    of that limit (its default share of a container's memory) holding the API process, the weights and a margin,
    allows more: the operator never asks for memory the runtime would refuse itself."""
    for memory_gib, processes in ((4, 1), (8, 2), (32, 1)):
        spec = parse_spec({
            "model": {"uri": "pvc://models/smollm2"}, "resources": {"gpus": 0, "cpu": "2", "memory": f"{memory_gib}Gi"},
            "parallelism": {"tensor": processes}})
        operator_gib = kv_cache_memory_gib(spec)
        in_use = processes * (0.54 + 0.4) * GIB   # each process: SmolLM2's fp32 weights and an API process's share
        pod = HostMemory(memory_gib * GIB, int(memory_gib * GIB - in_use), "the cgroup's memory limit", dedicated=True)
        margin = kv_sizing.activation_margin(2048, 256, 576, 1536, 49152, 4)
        runtime_gib = cpu_kv_budget(pod, kv_sizing.DEDICATED_UTILIZATION, margin, processes) / GIB
        assert operator_gib <= runtime_gib, (memory_gib, processes, operator_gib, runtime_gib)


@pytest.mark.parametrize("dedicated, share", [(False, 0.5), (True, 0.9)])
def test_the_default_share_is_a_containers_memory_or_half_a_machines(llama_dir, monkeypatch, dedicated, share):
    from kubeinfer.runtime.config import EngineConfig
    memory = HostMemory(16 * GIB, 14 * GIB, "test", dedicated)
    monkeypatch.setattr(kv_sizing, "read_host_memory", lambda: memory)
    config = EngineConfig(model=str(llama_dir), max_num_batched_tokens=64, max_num_seqs=8)
    budget, source = kv_sizing.kv_budget(config, torch.device("cpu"), torch.float32)
    assert budget == cpu_kv_budget(memory, share, kv_sizing.MIN_ACTIVATION_MARGIN)
    assert source.startswith(f"cpu_memory_utilization {share:g} of 16.0 GiB")
    explicit = EngineConfig(model=str(llama_dir), cpu_memory_utilization=0.25)
    assert kv_sizing.kv_budget(explicit, torch.device("cpu"), torch.float32)[0] < budget


def test_a_busy_machine_keeps_the_old_fixed_pool_where_that_much_is_free(llama_dir, monkeypatch):
    """Under half of a machine available, the rule gives nothing; the engine still starts with 0.5 GiB when that much
    is free beyond the margin, and with what is free when less is."""
    from kubeinfer.runtime.config import EngineConfig
    config = EngineConfig(model=str(llama_dir), max_num_batched_tokens=64, max_num_seqs=8)
    monkeypatch.setattr(kv_sizing, "read_host_memory", lambda: HostMemory(16 * GIB, 4 * GIB, "test"))
    budget, source = kv_sizing.kv_budget(config, torch.device("cpu"), torch.float32)
    assert budget == kv_sizing.CPU_FLOOR and "raised to the 0.5 GiB floor" in source
    tight = HostMemory(16 * GIB, kv_sizing.MIN_ACTIVATION_MARGIN + 100 * 2**20, "test")
    monkeypatch.setattr(kv_sizing, "read_host_memory", lambda: tight)
    assert kv_sizing.kv_budget(config, torch.device("cpu"), torch.float32)[0] == 100 * 2**20


def test_a_share_the_user_set_is_not_raised_to_the_floor(llama_dir, monkeypatch):
    from kubeinfer.runtime.config import EngineConfig
    config = EngineConfig(model=str(llama_dir), max_num_batched_tokens=64, max_num_seqs=8, cpu_memory_utilization=0.5)
    monkeypatch.setattr(kv_sizing, "read_host_memory", lambda: HostMemory(16 * GIB, 4 * GIB, "test"))
    budget, source = kv_sizing.kv_budget(config, torch.device("cpu"), torch.float32)
    assert budget == 0 and "floor" not in source
