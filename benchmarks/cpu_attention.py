"""The native CPU paged attention against the hardware limit and against PyTorch, in one run.

- Decode: 64 sequences over a 4-layer paged cache, layer after layer as a forward walks them (so K/V come from
  DRAM, not from cache): the bytes of K/V read per second, beside a streaming `sum` over a tensor of the same
  total size (what this machine reads at best) and the PyTorch reference (gather + SDPA).
- Prefill: one sequence's chunk of n tokens, causal: GFLOP/s of the kernel beside PyTorch's
  `scaled_dot_product_attention` on the same dense tensors, and beside this machine's fp32 GEMM rate
  (`F.linear` on the model's gate/up shape, 2048 x 512 x 2730: about what a CPU attention could reach).

    python -P benchmarks/cpu_attention.py [--shape smollm2-135m] [--repeats 7]
"""
import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kubeinfer.kernels import cpu_attention, references
from kubeinfer.kernels.metadata import AttentionMetadata

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402
from shapes import CPU_SHAPES, SHAPES   # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16   # the SmolLM2 shape's; main() sets --shape's


def best_seconds(run, repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def decode(lengths: tuple[int, int], layers: int, repeats: int) -> None:
    rng = random.Random(0)
    seq_lens = [rng.randint(*lengths) for _ in range(64)]
    blocks = [-(-n // BLOCK) for n in seq_lens]
    kv = torch.randn(2, layers, sum(blocks) + 1, BLOCK, KV_HEADS, HEAD_DIM)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    ids = list(range(1, sum(blocks) + 1))
    rng.shuffle(ids)   # blocks anywhere in the cache, as a long-running server leaves them
    for i, n in enumerate(blocks):
        tables[i, :n] = torch.tensor(ids[sum(blocks[:i]):sum(blocks[:i]) + n])
    meta = AttentionMetadata(torch.arange(len(seq_lens) + 1, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32),
                             tables, 1, max(seq_lens), torch.zeros(0, dtype=torch.int64))
    q = torch.randn(len(seq_lens), HEADS, HEAD_DIM)
    gigabytes = sum(seq_lens) * KV_HEADS * HEAD_DIM * 4 * 2 / 1e9   # K and V of every sequence, one layer
    walk = lambda attend: [attend(q, kv[0, layer], kv[1, layer], meta, HEAD_DIM ** -0.5) for layer in range(layers)]   # noqa: E731
    native = best_seconds(lambda: walk(cpu_attention.paged_attention), repeats) / layers
    reference = best_seconds(lambda: walk(references.paged_attention), max(1, repeats // 3)) / layers
    stream = torch.ones(int(gigabytes * layers * 1e9 / 4))
    limit = best_seconds(stream.sum, repeats) / layers
    print(f"decode, 64 sequences of {lengths[0]}-{lengths[1]} tokens, {layers} layers ({gigabytes * 1e3:.0f} MB of K/V "
          f"a layer): native {native * 1e3:.2f} ms = {gigabytes / native:.1f} GB/s | streaming sum of the same bytes "
          f"{gigabytes / limit:.1f} GB/s | reference {reference * 1e3:.1f} ms")


def prefill(n: int, repeats: int) -> None:
    q, k, v = torch.randn(n, HEADS, HEAD_DIM), torch.randn(n, KV_HEADS, HEAD_DIM), torch.randn(n, KV_HEADS, HEAD_DIM)
    cache_k = k.view(n // BLOCK, BLOCK, KV_HEADS, HEAD_DIM)
    cache_v = v.view(n // BLOCK, BLOCK, KV_HEADS, HEAD_DIM)
    meta = AttentionMetadata(torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32),
                             torch.arange(n // BLOCK, dtype=torch.int32).view(1, -1), n, n,
                             torch.zeros(0, dtype=torch.int64))
    flops = n * n / 2 * HEADS * HEAD_DIM * 4   # causal: QK^T and PV over the visible half
    native = best_seconds(lambda: cpu_attention.paged_attention(q, cache_k, cache_v, meta, HEAD_DIM ** -0.5), repeats)
    sdpa = best_seconds(lambda: F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                               is_causal=True, enable_gqa=True), repeats)
    print(f"prefill, {n} tokens: native {flops / native / 1e9:.1f} GFLOP/s | SDPA {flops / sdpa / 1e9:.1f} GFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0], help="its attention heads")
    args = parser.parse_args()
    global HEADS, KV_HEADS, HEAD_DIM
    shape = SHAPES[args.shape]
    HEADS, KV_HEADS, HEAD_DIM = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    assert cpu_attention.supports(torch.zeros(1, HEADS, HEAD_DIM), torch.zeros(1, BLOCK, KV_HEADS, HEAD_DIM)), \
        "the native kernel is not built here (no C compiler?)"
    print(f"machine: {describe()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"{args.shape}'s {HEADS} query / {KV_HEADS} KV heads of {HEAD_DIM}, fp32, block {BLOCK}")
    decode((300, 700), 4, args.repeats)
    decode((800, 1500), 4, args.repeats)
    for n in (128, 512, 2048):
        prefill(n, args.repeats)
    x, weight = torch.randn(2048, 512), torch.randn(2730, 512)
    gemm = best_seconds(lambda: F.linear(x, weight), args.repeats)
    print(f"fp32 GEMM, F.linear 2048x512x2730: {2 * 2048 * 512 * 2730 / gemm / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
