"""Attention kernel figures on one GPU: decode bandwidth and prefill TFLOP/s, beside PyTorch's SDPA.

    python benchmarks/kernels.py [--batch 64] [--context 2048] [--prefill-len 2048] [--block-size 16]

Shapes are Llama-3-8B's attention layout (32 query heads, 8 KV heads, head_dim 128), bf16, fixed seed.
- Decode: one query per sequence over `context` cached tokens in a paged cache whose blocks are shuffled.
  Bytes counted = what the op must move at least: K and V of every cached token read once
  (batch * context * kv_heads * head_dim * 2 tensors * 2 bytes), plus q read and out written; block
  tables and split scratch are not counted. % of peak uses the HBM peak of the device (table below).
  SDPA runs on dense, unpaged `[batch, kv_heads, context, head_dim]` K/V with `enable_gqa=True`.
- Prefill: `prefill_batch` prompts of `prefill_len` tokens, causal; FLOPs counted = 4 * heads * head_dim
  * (number of visible query-key pairs) (QK^T and PV, 2 FLOPs per multiply-add, masked pairs excluded);
  SDPA runs with `is_causal=True` on the same dense shapes.
Timings: `triton.testing.do_bench`, median of repeated runs after warm-up. Without CUDA it says so and
exits 0.
"""
import argparse
import sys
from pathlib import Path

import torch

try:
    import kubeinfer.kernels  # noqa: F401
except ImportError:  # a bare checkout (no `pip install -e .`): map kubeinfer.kernels onto ./kernels
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kubeinfer
    kubeinfer.__path__.append(str(Path(__file__).resolve().parents[1]))

# HBM peak bandwidth in bytes/s, matched against torch.cuda.get_device_name() in this order.
HBM_PEAK = [
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),          # SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 2.039e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
]
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
# Launch configurations swept beside the launchers' defaults (--sweep): decode (BLOCK_N, num_warps,
# num_stages) and extend (BLOCK_M, BLOCK_N, num_warps, num_stages).
DECODE_SWEEP = [(32, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3), (64, 4, 2, True), (128, 4, 2, True),
                (128, 8, 2, True), (64, 8, 2, True)]
# FP8-cache launches beside its default (--sweep): fifth item fp16_tiles (e4m3 -> fp16 tiles and an fp16 query
# for the dots, instead of bf16).
FP8_SWEEP = [(128, 4, 2, True, True), (64, 4, 2, True, True), (128, 8, 2, True, True), (64, 4, 2, False, True),
             (128, 4, 2, False, True), (32, 4, 2, True, True), (128, 4, 2, True, False), (256, 4, 2, False, True),
             (256, 8, 2, False, True), (128, 4, 3, False, True), (128, 8, 3, False, True)]
# An extend entry's optional fifth to seventh items: K's tiles loaded as stored then transposed, loads masked along
# head_dim although it fills the tile (the kernel before 2026-11-26, night), a KV group's heads packed in a program.
EXTEND_SWEEP = [(128, 32, 4, 3, False, True), (128, 32, 4, 3, True), (128, 32, 4, 4), (128, 32, 4, 2),
                (128, 64, 4, 3), (128, 64, 4, 3, True), (128, 64, 8, 3), (128, 64, 8, 3, True), (128, 128, 8, 2),
                (128, 128, 8, 3, True), (64, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 4, True),
                (128, 32, 4, 3, True, False, True), (128, 64, 4, 3, True, False, True), (128, 64, 8, 3, True, False, True),
                (128, 128, 8, 3, True, False, True), (64, 32, 4, 3, True, False, True)]


def hbm_peak(name: str) -> float | None:
    return next((peak for key, peak in HBM_PEAK if key in name), None)


def paged_batch(seq_lens: list[int], q_lens: list[int], block_size: int, dtype: torch.dtype, device: str,
                shuffle: bool = True):
    """Random q and a paged cache holding every sequence's K/V in shuffled blocks (in order with `shuffle`
    off: each sequence's blocks contiguous, to see what the scattered gather costs); also the dense K/V."""
    from kubeinfer.kernels.metadata import AttentionMetadata

    gen = torch.Generator(device=device).manual_seed(0)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq)
    order = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    if not shuffle:
        order = torch.arange(num_blocks, device=device, dtype=torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32, device=device)
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = order[used:used + nb]
        used += nb
    q = torch.randn(sum(q_lens), NUM_HEADS, HEAD_DIM, generator=gen, device=device, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    meta = AttentionMetadata(cu_seqlens_q=cu, seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
                             block_tables=tables, max_seqlen_q=max(q_lens), max_seqlen_k=max(seq_lens),
                             slot_mapping=torch.full((sum(q_lens),), -1, dtype=torch.int64, device=device))
    # Dense copies for SDPA, [batch, kv_heads, seq, head_dim] (all sequences have the same length here).
    length = seq_lens[0]
    dense = [c[tables.long()].flatten(1, 2)[:, :length].transpose(1, 2).contiguous() for c in (k_cache, v_cache)]
    return q, k_cache, v_cache, meta, dense[0], dense[1]


def time_ms(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy, counting bytes read and written (the practical HBM ceiling)."""
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / (time_ms(lambda: dst.copy_(src)) * 1e-3)


def bench_decode(batch: int, context: int, block_size: int, dtype: torch.dtype, peak: float | None,
                 copy_bw: float | None = None) -> None:
    import torch.nn.functional as F
    from kubeinfer.kernels.decode_attention import decode_attention

    q, k_cache, v_cache, meta, dense_k, dense_v = paged_batch([context] * batch, [1] * batch, block_size, dtype, "cuda")
    scale = HEAD_DIM ** -0.5
    elem = torch.finfo(dtype).bits // 8
    bytes_moved = (2 * batch * context * NUM_KV_HEADS * HEAD_DIM + 2 * batch * NUM_HEADS * HEAD_DIM) * elem
    sdpa_q = q.view(batch, NUM_HEADS, 1, HEAD_DIM)

    def sdpa():
        return F.scaled_dot_product_attention(sdpa_q, dense_k, dense_v, scale=scale, enable_gqa=True)

    error = (decode_attention(q, k_cache, v_cache, meta, scale).float() - sdpa().view_as(q).float()).abs().max()
    print(f"\n## Decode attention: batch {batch}, context {context}, block size {block_size}, "
          f"{NUM_HEADS}/{NUM_KV_HEADS} heads x {HEAD_DIM}, {dtype}; max |triton - sdpa| = {float(error):.2e}")
    print(f"bytes counted per call: {bytes_moved / 1e6:.1f} MB (K+V of every cached token once, q, out)")
    print("| impl | splits | time (us) | GB/s | % HBM peak |\n|---|---|---|---|---|")

    def row(name, splits, ms):
        gbps = bytes_moved / (ms * 1e-3) / 1e9
        pct = f"{100 * gbps * 1e9 / peak:.0f}%" if peak else "n/a"
        copy = f" ({100 * gbps * 1e9 / copy_bw:.0f}% of copy)" if copy_bw else ""
        print(f"| {name} | {splits} | {ms * 1e3:.1f} | {gbps:.0f} | {pct}{copy} |")

    row("triton paged (default)", "auto", time_ms(lambda: decode_attention(q, k_cache, v_cache, meta, scale)))
    for splits in (1, 2, 4, 8, 16):
        row("triton paged", splits, time_ms(lambda: decode_attention(q, k_cache, v_cache, meta, scale,
                                                                     num_kv_splits=splits)))
    for config in DECODE_SWEEP:
        for splits in (1, 2):
            name = f"triton paged, BLOCK_N/warps/stages {config}"
            try:
                row(name, splits, time_ms(lambda: decode_attention(q, k_cache, v_cache, meta, scale,
                                                                   num_kv_splits=splits, config=config)))
            except Exception as error:   # e.g. out of shared memory: the sweep goes on
                print(f"| {name} | {splits} | failed: {type(error).__name__} | | |")
    row("torch SDPA (dense)", "-", time_ms(sdpa))
    fp8_decode_row(q, k_cache, v_cache, meta, scale, bytes_moved, elem, copy_bw)
    if copy_bw:
        print(f"measured copy bandwidth {copy_bw / 1e9:.0f} GB/s: the default reaches "
              f"{bytes_moved / (time_ms(lambda: decode_attention(q, k_cache, v_cache, meta, scale)) * 1e-3) / copy_bw:.0%} of it")


def fp8_decode_row(q, k_cache, v_cache, meta, scale, bytes_moved, elem, copy_bw) -> None:
    """The same batch from an FP8 (e4m3) cache: K/V bytes halve (bf16 -> 1 byte), so the time should too."""
    from kubeinfer.kernels.decode_attention import decode_attention
    from kubeinfer.kernels.metadata import FP8_DTYPE, FP8_MAX

    k_scale = float(k_cache.abs().max()) / FP8_MAX
    v_scale = float(v_cache.abs().max()) / FP8_MAX
    k8, v8 = (k_cache / k_scale).to(FP8_DTYPE), (v_cache / v_scale).to(FP8_DTYPE)
    kv_bytes = 2 * k_cache.numel() * elem
    moved = bytes_moved - kv_bytes + kv_bytes // elem
    exact = decode_attention(q, k_cache, v_cache, meta, scale).float()
    for config in [None, *FP8_SWEEP, *DECODE_SWEEP]:
        def run(config=config):
            return decode_attention(q, k8, v8, meta, scale, k_scale=k_scale, v_scale=v_scale, config=config)
        try:
            error = float((run().float() - exact).abs().max())
            ms = time_ms(run)
        except Exception as error:   # e.g. out of shared memory: the sweep goes on
            print(f"| triton paged, FP8 e4m3 cache, {config} | auto | failed: {type(error).__name__} | | |")
            continue
        gbps = moved / (ms * 1e-3)
        copy = f" ({gbps / copy_bw:.0%} of copy)" if copy_bw else ""
        print(f"| triton paged, FP8 e4m3 cache, {config or 'default'} ({moved / 1e6:.1f} MB counted; max |fp8 - "
              f"bf16 cache| = {error:.2e}) | auto | {ms * 1e3:.1f} | {gbps / 1e9:.0f} | -{copy} |")


def bench_prefill(batch: int, length: int, block_size: int, dtype: torch.dtype) -> None:
    import torch.nn.functional as F
    from kubeinfer.kernels.extend_attention import extend_attention

    q, k_cache, v_cache, meta, dense_k, dense_v = paged_batch([length] * batch, [length] * batch, block_size,
                                                              dtype, "cuda")
    scale = HEAD_DIM ** -0.5
    flops = 4 * NUM_HEADS * HEAD_DIM * batch * length * (length + 1) / 2
    sdpa_q = q.view(batch, length, NUM_HEADS, HEAD_DIM).transpose(1, 2)

    def sdpa():
        return F.scaled_dot_product_attention(sdpa_q, dense_k, dense_v, is_causal=True, scale=scale, enable_gqa=True)

    got = extend_attention(q, k_cache, v_cache, meta, scale)
    error = (got.float() - sdpa().transpose(1, 2).reshape_as(q).float()).abs().max()
    print(f"\n## Prefill attention: batch {batch} x {length} tokens, causal, block size {block_size}, "
          f"{NUM_HEADS}/{NUM_KV_HEADS} heads x {HEAD_DIM}, {dtype}; max |triton - sdpa| = {float(error):.2e}")
    print(f"FLOPs counted per call: {flops / 1e12:.3f} TFLOP (QK^T + PV over visible pairs)")
    print("| impl | time (ms) | TFLOP/s |\n|---|---|---|")
    runs = [("triton paged extend (default)", lambda: extend_attention(q, k_cache, v_cache, meta, scale))]
    in_order = paged_batch([length] * batch, [length] * batch, block_size, dtype, "cuda", shuffle=False)
    runs.append(("triton paged extend, each sequence's blocks in order",
                 lambda: extend_attention(in_order[0], in_order[1], in_order[2], in_order[3], scale)))
    runs += [(f"triton paged extend, BLOCK_M/N/warps/stages {c}",
              lambda c=c: extend_attention(q, k_cache, v_cache, meta, scale, config=c)) for c in EXTEND_SWEEP]
    for name, fn in runs + [("torch SDPA (dense, causal)", sdpa)]:
        try:
            ms = time_ms(fn)
        except Exception as error:   # e.g. out of shared memory: the sweep goes on
            print(f"| {name} | failed: {type(error).__name__} | |")
            continue
        print(f"| {name} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--prefill-batch", type=int, default=4)
    parser.add_argument("--prefill-len", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--sweep", action="store_true", help="also time the launch configurations of the sweep lists")
    parser.add_argument("--prefill-only", action="store_true", help="the prefill figures alone")
    parser.add_argument("--decode-only", action="store_true", help="the decode figures alone")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU (none found): no figures on this machine.")
        return 0
    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name()
    peak = hbm_peak(name)
    import triton
    print(f"# Kernels on {name} ({torch.cuda.get_device_properties(0).multi_processor_count} SMs, "
          f"HBM peak {peak / 1e12 if peak else float('nan'):.2f} TB/s); torch {torch.__version__}, "
          f"triton {triton.__version__}")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"measured copy bandwidth: {copy_bw / 1e9:.0f} GB/s (1 GiB device-to-device, read + write)")
    if not args.sweep:
        DECODE_SWEEP.clear()
        FP8_SWEEP.clear()
        EXTEND_SWEEP.clear()
    if not args.prefill_only:
        bench_decode(args.batch, args.context, args.block_size, dtype, peak, copy_bw)
    if not args.decode_only:
        bench_prefill(args.prefill_batch, args.prefill_len, args.block_size, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
