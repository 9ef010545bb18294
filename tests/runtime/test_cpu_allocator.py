"""`keep_freed_memory`: a step's activations (up to 32 MiB each) come from glibc's heap, which is reused,
instead of fresh mmaps that every step faults in again (the page-fault figures are in docs/benchmarks.md)."""
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
