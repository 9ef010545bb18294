"""The native CPU paged attention against the hardware limit and against PyTorch, in one run.

- Decode: 64 sequences over a 4-layer paged cache, layer after layer as a forward walks them (so K/V come from
  DRAM, not from cache): the bytes of K/V read per second, beside a streaming `sum` over a tensor of the same
  total size (what this machine reads at best) and the PyTorch reference (gather + SDPA).
- Prefill: one sequence's chunk of n tokens, causal: GFLOP/s of the kernel beside PyTorch's
  `scaled_dot_product_attention` on the same dense tensors, and beside this machine's fp32 GEMM rate
  (`F.linear` on the model's gate/up shape, 2048 x 512 x 2730: about what a CPU attention could reach).

- With `--baseline DIR` (another version's `kernels/csrc`, e.g. from `git worktree add /tmp/base HEAD~1`), the decode
  and prefill (4 x 200, 2 x 512, 1 x 2048 tokens, blocks shuffled; `--phases`) figures of that build beside this
  one's, the two alternating in one process: each pair's ratio, and their median (this box's read rate drifts by a
  third within minutes, so only alternated figures compare).

    python -P benchmarks/cpu_attention.py [--shape smollm2-135m] [--repeats 7] [--baseline DIR] [--kv-dtype bfloat16]
                                             [--phases decode prefill]
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kubeinfer.kernels import cpu_attention, cpu_native, references
from kubeinfer.kernels.metadata import AttentionMetadata
from kubeinfer.runtime.engine.kv_sizing import lazy_zeros

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


def kernel_built_from(sources: Path, cache_dtype: torch.dtype):
    """The kernel function compiled from another source folder, built and cached as the library is
    (`cpu_native.library_from`), loaded beside this build's."""
    library = cpu_native.library_from(cpu_attention.KERNELS[cache_dtype][0], sources)
    return cpu_attention.kernel_function(library, cache_dtype)


def alternate(baseline, run, work: float, rounds: int, cache_dtype: torch.dtype) -> tuple[float, float, list[float]]:
    """`run()` with `baseline`'s kernel and this build's, alternating `rounds` times: the median rate (`work` over
    seconds) of each, and each pair's ratio, sorted."""
    ours = cpu_attention._kernel(cache_dtype)
    rates = {"baseline": [], "this build": []}
    for _ in range(rounds):
        for name, function in (("baseline", baseline), ("this build", ours)):
            cpu_attention._functions[cache_dtype] = function
            started = time.perf_counter()
            run()
            rates[name].append(work / (time.perf_counter() - started))
    cpu_attention._functions[cache_dtype] = ours
    ratios = sorted(new / old for new, old in zip(rates["this build"], rates["baseline"]))
    return statistics.median(rates["baseline"]), statistics.median(rates["this build"]), ratios


def decode_against(baseline, lengths: tuple[int, int], layers: int, rounds: int, cache_dtype: torch.dtype) -> None:
    """This build and `baseline` alternating, `rounds` times each over the same cache: GB/s, and each pair's ratio."""
    q, kv, meta, gigabytes = decode_inputs(lengths, layers, cache_dtype)
    old, new, ratios = alternate(baseline, lambda: walk(cpu_attention.paged_attention, q, kv, meta, layers),
                                 gigabytes * layers, rounds, cache_dtype)
    print(f"decode, 64 sequences of {lengths[0]}-{lengths[1]} tokens, {cache_dtype}: baseline {old:.1f} GB/s, this "
          f"build {new:.1f} GB/s (medians of {rounds}); this / baseline {statistics.median(ratios):.2f} "
          f"(pairs {ratios[0]:.2f}-{ratios[-1]:.2f})")


def prefill_against(baseline, lengths: list[int], rounds: int, cache_dtype: torch.dtype) -> None:
    """A prefill step's attention (whole prompts of `lengths`, blocks shuffled over the pool), this build and
    `baseline` alternating: GFLOP/s and each pair's ratio."""
    q, kv, meta, flops = prefill_inputs(lengths, cache_dtype)
    old, new, ratios = alternate(baseline, lambda: cpu_attention.paged_attention(q, kv[0], kv[1], meta,
                                                                                 HEAD_DIM ** -0.5),
                                 flops / 1e9, rounds, cache_dtype)
    print(f"prefill, {len(lengths)} x {lengths[0]} tokens, {cache_dtype}: baseline {old:.1f} GFLOP/s, this build "
          f"{new:.1f} GFLOP/s (medians of {rounds}); this / baseline {statistics.median(ratios):.2f} "
          f"(pairs {ratios[0]:.2f}-{ratios[-1]:.2f})")


def prefill_inputs(lengths: list[int], cache_dtype: torch.dtype = torch.float32):
    """Queries and a one-layer cache (blocks shuffled) for prompts of `lengths` prefilled whole in one step, its
    metadata, and the causal attention's FLOPs."""
    rng = random.Random(0)
    blocks = [-(-n // BLOCK) for n in lengths]
    kv = lazy_zeros((2, sum(blocks) + 1, BLOCK, KV_HEADS, HEAD_DIM), cache_dtype)
    kv.copy_(torch.randn(kv.shape))
    ids = list(range(1, sum(blocks) + 1))
    rng.shuffle(ids)
    tables = torch.zeros(len(lengths), max(blocks), dtype=torch.int32)
    for i, n in enumerate(blocks):
        tables[i, :n] = torch.tensor(ids[sum(blocks[:i]):sum(blocks[:i]) + n])
    cu_seqlens = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32)
    meta = AttentionMetadata(cu_seqlens, torch.tensor(lengths, dtype=torch.int32), tables, max(lengths), max(lengths),
                             torch.zeros(0, dtype=torch.int64))
    flops = sum(n * n / 2 for n in lengths) * HEADS * HEAD_DIM * 4   # causal: QK^T and PV over the visible half
    return torch.randn(sum(lengths), HEADS, HEAD_DIM), kv, meta, flops


def walk(attend, q: torch.Tensor, kv: torch.Tensor, meta: AttentionMetadata, layers: int) -> None:
    """One decode step's attention over every layer of the cache, layer after layer as a forward walks them."""
    for layer in range(layers):
        attend(q, kv[0, layer], kv[1, layer], meta, HEAD_DIM ** -0.5)


def decode_inputs(lengths: tuple[int, int], layers: int, cache_dtype: torch.dtype = torch.float32):
    """Queries, a K/V cache of `layers` layers (blocks shuffled, allocated as the engine's pool is), the metadata of
    64 decoding sequences, and the K/V gigabytes a layer reads."""
    rng = random.Random(0)
    seq_lens = [rng.randint(*lengths) for _ in range(64)]
    blocks = [-(-n // BLOCK) for n in seq_lens]
    kv = lazy_zeros((2, layers, sum(blocks) + 1, BLOCK, KV_HEADS, HEAD_DIM), cache_dtype)   # as the engine's pool
    kv.copy_(torch.randn(kv.shape))
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    ids = list(range(1, sum(blocks) + 1))
    rng.shuffle(ids)   # blocks anywhere in the cache, as a long-running server leaves them
    for i, n in enumerate(blocks):
        tables[i, :n] = torch.tensor(ids[sum(blocks[:i]):sum(blocks[:i]) + n])
    meta = AttentionMetadata(torch.arange(len(seq_lens) + 1, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32),
                             tables, 1, max(seq_lens), torch.zeros(0, dtype=torch.int64))
    q = torch.randn(len(seq_lens), HEADS, HEAD_DIM)
    gigabytes = sum(seq_lens) * KV_HEADS * HEAD_DIM * kv.element_size() * 2 / 1e9   # K and V of every sequence, one layer
    return q, kv, meta, gigabytes


def decode(lengths: tuple[int, int], layers: int, repeats: int) -> None:
    q, kv, meta, gigabytes = decode_inputs(lengths, layers)
    native = best_seconds(lambda: walk(cpu_attention.paged_attention, q, kv, meta, layers), repeats) / layers
    reference = best_seconds(lambda: walk(references.paged_attention, q, kv, meta, layers), max(1, repeats // 3)) / layers
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
    parser.add_argument("--baseline", type=Path, help="another kernels/csrc: its decode beside this one's, alternating")
    parser.add_argument("--kv-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the cache's dtype for --baseline's comparison")
    parser.add_argument("--phases", nargs="+", choices=["decode", "prefill"], default=["decode", "prefill"],
                        help="what --baseline compares")
    args = parser.parse_args()
    global HEADS, KV_HEADS, HEAD_DIM
    shape = SHAPES[args.shape]
    HEADS, KV_HEADS, HEAD_DIM = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    assert cpu_attention.supports(torch.zeros(1, HEADS, HEAD_DIM), torch.zeros(1, BLOCK, KV_HEADS, HEAD_DIM)), \
        "the native kernel is not built here (no C compiler?)"
    print(f"machine: {describe()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"{args.shape}'s {HEADS} query / {KV_HEADS} KV heads of {HEAD_DIM}, fp32, block {BLOCK}")
    if args.baseline is not None:
        cache_dtype = getattr(torch, args.kv_dtype)
        baseline = kernel_built_from(args.baseline, cache_dtype)
        assert baseline is not None, f"no kernel could be built from {args.baseline}"
        for lengths in ((300, 700), (800, 1500)) if "decode" in args.phases else ():
            decode_against(baseline, lengths, 4, 2 * args.repeats + 1, cache_dtype)
        for lengths in ([200] * 4, [512] * 2, [2048]) if "prefill" in args.phases else ():
            prefill_against(baseline, lengths, 2 * args.repeats + 1, cache_dtype)
        return
    decode((300, 700), 4, args.repeats)
    decode((800, 1500), 4, args.repeats)
    for n in (128, 512, 2048):
        prefill(n, args.repeats)
    x, weight = torch.randn(2048, 512), torch.randn(2730, 512)
    gemm = best_seconds(lambda: F.linear(x, weight), args.repeats)
    print(f"fp32 GEMM, F.linear 2048x512x2730: {2 * 2048 * 512 * 2730 / gemm / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
