"""The paged K/V cache write on the CPU, per layer and per step: the PyTorch reference (the runtime's path before
the native kernel) against the native kernel (kernels/csrc/elementwise_cpu.c), alternated in one process.

    python -P benchmarks/cpu_kv_store.py [--shape smollm2-135m] [--tokens 1 16 64 2048] [--repeats 2000]

K and V are views of one fused QKV row per token, as the attention layer passes them; slots are scattered over a
cache of 4,096 blocks of 16. Each figure: the median of `--repeats` calls of each, taken in turn; "per step" is that
times the shape's layers (every layer writes once a step).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402
from shapes import CPU_SHAPES, SHAPES   # noqa: E402

from kubeinfer.kernels import cpu_elementwise, references   # noqa: E402

BLOCKS, BLOCK_SIZE = 4096, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="smollm2-135m", choices=CPU_SHAPES)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 2048])
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    config = SHAPES[args.shape]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or config["hidden_size"] // heads
    layers, dtype = config["num_hidden_layers"], getattr(torch, args.dtype)
    print(describe())
    print(f"{args.shape}: {layers} layers, {kv_heads} KV heads of {d}, {args.dtype}; median of {args.repeats} calls")
    caches = [torch.zeros(BLOCKS, BLOCK_SIZE, kv_heads, d, dtype=dtype) for _ in range(2)]
    print("| tokens | reference us/layer | native us/layer | reference ms/step | native ms/step | speed-up |")
    print("|---|---|---|---|---|---|")
    for tokens in args.tokens:
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d).to(dtype)
        k = qkv[:, heads * d:(heads + kv_heads) * d].view(tokens, kv_heads, d)
        v = qkv[:, (heads + kv_heads) * d:].view(tokens, kv_heads, d)
        slots = torch.randperm(BLOCKS * BLOCK_SIZE)[:tokens]
        times: dict[str, list[float]] = {"reference": [], "native": []}
        for _ in range(args.repeats):
            for name in times:
                started = time.perf_counter()
                if name == "native":
                    assert cpu_elementwise.store_kv(k, v, *caches, slots)
                else:
                    references.store_kv(k, v, *caches, slots)
                times[name].append(time.perf_counter() - started)
        ref, native = (statistics.median(times[n]) * 1e6 for n in ("reference", "native"))
        print(f"| {tokens} | {ref:.1f} | {native:.1f} | {ref * layers / 1e3:.2f} | {native * layers / 1e3:.2f} | "
              f"{ref / native:.1f}x |")


if __name__ == "__main__":
    main()
