"""Two builds of the CPU ops around the GEMMs (`kernels/csrc/elementwise_cpu.c`: RMSNorm with the residual, rotary
embedding, SiLU-and-mul) side by side: the tree's and a baseline's, on the same tensors (SmolLM2's shapes: hidden
576, 9 / 3 heads of 64, intermediate 1536; q and k views of one fused QKV row, as the model passes them), alternating,
with a check that both give bit-identical outputs.

    git worktree add /tmp/base HEAD~1
    python -P benchmarks/cpu_elementwise_ab.py --baseline /tmp/base/kernels/csrc [--tokens 16 512 2040] [--rounds 5]

Each build is compiled and cached as the library is (kernels/cpu_native.py, `library_from`). Each round times both
builds, each the mean of 100 calls after one; the figure is the median over rounds (the 2-vCPU box's single calls
spread too widely to compare).
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

from kubeinfer.kernels import cpu_native
from kubeinfer.runtime.cpu_allocator import keep_freed_memory

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 576, 9, 3, 64, 1536
P, I64 = ctypes.c_void_p, ctypes.c_int64


def op_calls(tokens: int) -> dict:
    """Each op as a function of a library that returns its fresh outputs."""
    torch.manual_seed(tokens)
    x, residual, weight = torch.randn(tokens, HIDDEN), torch.randn(tokens, HIDDEN), torch.randn(HIDDEN)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    q = qkv[:, :HEADS * HEAD_DIM].view(tokens, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].view(tokens, KV_HEADS, HEAD_DIM)
    positions, cos_sin = torch.randint(0, 4000, (tokens,)), torch.randn(4096, HEAD_DIM)
    gate_up = torch.randn(tokens, 2 * INTERMEDIATE) * 4

    def rms_norm(lib):
        out, kept = torch.empty_like(x), torch.empty_like(x)
        lib.kubeinfer_rms_norm(P(x.data_ptr()), I64(tokens), I64(1), I64(HIDDEN), I64(HIDDEN), P(residual.data_ptr()),
                               P(weight.data_ptr()), I64(HIDDEN), ctypes.c_float(1e-5), P(out.data_ptr()),
                               P(kept.data_ptr()), ctypes.c_int32(0))
        return out, kept

    def rotary(lib):
        q_out, k_out = torch.empty(tokens, HEADS, HEAD_DIM), torch.empty(tokens, KV_HEADS, HEAD_DIM)
        lib.kubeinfer_rotary(P(positions.data_ptr()), I64(tokens), P(q.data_ptr()), I64(q.stride(0)), I64(HEADS),
                             P(k.data_ptr()), I64(k.stride(0)), I64(KV_HEADS), I64(HEAD_DIM), P(cos_sin.data_ptr()),
                             P(q_out.data_ptr()), P(k_out.data_ptr()), ctypes.c_int32(0))
        return q_out, k_out

    def silu_and_mul(lib):
        out = torch.empty(tokens, INTERMEDIATE)
        lib.kubeinfer_silu_and_mul(P(gate_up.data_ptr()), I64(tokens), I64(2 * INTERMEDIATE), I64(INTERMEDIATE),
                                   P(out.data_ptr()), ctypes.c_int32(0))
        return (out,)

    return {"rms_norm + residual": rms_norm, "rotary": rotary, "silu_and_mul": silu_and_mul}


def mean_us(call, lib, repeats: int = 100) -> float:
    call(lib)
    started = time.perf_counter()
    for _ in range(repeats):
        call(lib)
    return (time.perf_counter() - started) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="a csrc folder holding the other elementwise_cpu.c")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 512, 2040])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    keep_freed_memory()   # as the engine runs: freed outputs come back from the heap, not as fresh pages
    tree = cpu_native.library("elementwise_cpu")
    baseline = cpu_native.library_from("elementwise_cpu", args.baseline)
    print(f"machine: {describe()}, {torch.get_num_threads()} torch threads, fp32")
    print("| op | tokens | baseline us | tree us | baseline / tree | bit-identical |")
    print("|---|---|---|---|---|---|")
    for tokens in args.tokens:
        for name, call in op_calls(tokens).items():
            same = all(torch.equal(a, b) for a, b in zip(call(baseline), call(tree)))
            old, new = [], []
            for _ in range(args.rounds):
                old.append(mean_us(call, baseline))
                new.append(mean_us(call, tree))
            old_us, new_us = statistics.median(old), statistics.median(new)
            print(f"| {name} | {tokens:,} | {old_us:.1f} | {new_us:.1f} | {old_us / new_us:.2f}x | {same} |",
                  flush=True)


if __name__ == "__main__":
    main()
