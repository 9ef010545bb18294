"""`keep_freed_memory`: a step's activations (up to 32 MiB each) come from glibc's heap, which is reused,
instead of fresh mmaps that every step faults in again (the page-fault figures are in
docs/benchmarks/cpu-runtime.md)."""
import json
import subprocess
import sys

import pytest

WHERE = """
import ctypes, json, sys
from kubeinfer.runtime.cpu_allocator import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
address = libc.malloc(24 * 2**20)   # an activation's size: 2048 tokens x 3072 features x 4 bytes
heap = [line.split()[0].split("-") for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
in_heap = any(int(lo, 16) <= address < int(hi, 16) for lo, hi in heap)
print(json.dumps({"took": took, "in_heap": in_heap}))
"""


def allocation(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-P", "-c", WHERE, mode], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_activation_sized_buffers_come_from_the_reused_heap():
    assert allocation("default") == {"took": None, "in_heap": False}   # glibc's default: a fresh mmap
    assert allocation("keep") == {"took": True, "in_heap": True}


def test_a_cpu_mlp_runs_in_blocks_whose_gate_up_output_stays_under_the_threshold(monkeypatch):
    """LlamaMLP on the CPU: a step of many tokens in row blocks (the same result as whole), so that no gate/up
    output goes past the mmap threshold; below it, whole."""
    from types import SimpleNamespace

    import torch

    from kubeinfer.runtime.models import llama
    torch.manual_seed(0)
    mlp = llama.LlamaMLP(SimpleNamespace(hidden_size=32, mlp_bias=False), intermediate_size=48)
    for parameter in mlp.parameters():
        parameter.data.normal_(std=0.2)
    x = torch.randn(100, 32)
    assert mlp.block_rows(x) >= 100   # 100 x 96 x 4 bytes: whole
    whole = mlp(x)
    monkeypatch.setattr(llama, "MMAP_THRESHOLD_BYTES", 96 * 4 * 7 + 1)
    assert mlp.block_rows(x) == 7
    blocks = []
    monkeypatch.setattr(mlp.gate_up_proj, "forward", lambda rows, project=mlp.gate_up_proj.forward:
                        blocks.append(rows.shape[0]) or project(rows))
    torch.testing.assert_close(mlp(x), whole)
    assert blocks == [7] * 14 + [2]
    # Qwen2.5-0.5B's MLP (896 -> 2 x 4,864) at a 2,048-token step: blocks of 862 rows, each output under 32 MiB.
    monkeypatch.setattr(llama, "MMAP_THRESHOLD_BYTES", 32 * 2**20)
    qwen = SimpleNamespace(gate_up_proj=SimpleNamespace(out_features=2 * 4864))
    rows = llama.LlamaMLP.block_rows(qwen, torch.empty(2048, 896))
    assert rows == 862 and rows * 2 * 4864 * 4 < 32 * 2**20 <= (rows + 1) * 2 * 4864 * 4
