"""Paged decode attention: one query token per sequence, split along the sequence (flash-decoding) (Triton).

Scope and assumptions:
- `q` is `[num_seqs, num_heads, head_dim]`, unit stride on `head_dim`; the query of sequence `i` is its
  last token, at position `seq_lens[i] - 1`, and its own K/V are already in the cache.
- `k_cache`/`v_cache` are `[num_blocks, block_size, num_kv_heads, head_dim]` (any block size; unit stride
  on `head_dim`); `block_tables` is int32 `[num_seqs, max_blocks]`, `seq_lens` int32 `[num_seqs]`
  (a padding row with seq_len 0, e.g. in a CUDA graph batch, yields zeros).
- Grouped-query attention: query head `h` reads KV head `h // (num_heads // num_kv_heads)`. One program
  serves a block of up to BLOCK_H query heads that share one KV head, so each K/V tile is read once per
  group, and the scores are a `[BLOCK_H, BLOCK_N]` `tl.dot` (BLOCK_H >= 16, padded heads are masked).
- Sliding window: the query sees only its last `sliding_window` keys; splits cover only those keys.

Split-K design (two launches):
1. `_decode_split_kernel`, grid `(num_seqs, num_kv_heads * head_blocks, num_splits)`: the visible keys
   of a sequence are cut into `num_splits` BLOCK_N-aligned ranges; each program runs an online softmax
   over its range and writes the normalised partial output and its log2-sum-exp to fp32 scratch.
   A split whose range is empty writes a zero output and lse = -inf.
2. `_decode_merge_kernel`, grid `(num_seqs, num_heads)`: merges the splits by their lse weights.
The split count depends on the batch's shape only (a heuristic on the device's SM count), never on the
data, so the kernel stays correct when a CUDA graph replays it with longer sequences.
"""
import torch
import triton
import triton.language as tl

from kubeinfer.kernels.metadata import FP8_DTYPE, AttentionMetadata

_LOG2E = 1.4426950408889634
_MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    Q, K_Cache, V_Cache, Block_Tables, Seq_Lens, Mid_Out, Mid_Lse,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    sm_scale_log2, v_scale, sliding_window, num_splits, head_dim,
    GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    K_ROWS_FIRST: tl.constexpr,
    FP16_TILES: tl.constexpr,
):
    seq = tl.program_id(0)
    HEAD_BLOCKS: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    head_block = tl.program_id(1) % HEAD_BLOCKS
    split = tl.program_id(2)

    offs_g = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim

    # This split's share of the visible keys, aligned to BLOCK_N.
    seq_len = tl.load(Seq_Lens + seq)
    kv_start = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(seq_len - sliding_window, 0)
    tokens_per_split = tl.cdiv(tl.cdiv(seq_len - kv_start, num_splits), BLOCK_N) * BLOCK_N
    split_start = kv_start + split * tokens_per_split
    split_end = tl.minimum(split_start + tokens_per_split, seq_len)

    q = tl.load(Q + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if FP16_TILES:   # an FP8 cache under a bf16 query: e4m3 -> fp16 is exact and one instruction a pair
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    table = Block_Tables + seq.to(tl.int64) * stride_bt

    running_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    denominator = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(split_start, split_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < split_end
        page = tl.load(table + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        in_page = offs_n % PAGE_SIZE

        if K_ROWS_FIRST:   # K as stored ([tokens, head_dim]), converted, then transposed in registers
            k = tl.trans(tl.load(K_Cache + page[:, None] * stride_kb + in_page[:, None] * stride_ks
                                 + kv_head * stride_kh + offs_d[None, :],
                                 mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(q.dtype))
        else:
            k = tl.load(K_Cache + page[None, :] * stride_kb + in_page[None, :] * stride_ks + kv_head * stride_kh
                        + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * sm_scale_log2      # [BLOCK_H, BLOCK_N]
        scores = tl.where(mask_n[None, :], scores, float("-inf"))

        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp2(running_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        denominator = denominator * rescale + tl.sum(probs, axis=1)

        v = tl.load(V_Cache + page[:, None] * stride_vb + in_page[:, None] * stride_vs + kv_head * stride_vh
                    + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(q.dtype)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        running_max = new_max

    # An empty split leaves denominator 0 and running_max -inf: it writes 0 and lse -inf (weight 0).
    has_keys = denominator > 0.0
    out = acc * v_scale / tl.where(has_keys, denominator, 1.0)[:, None]
    lse = tl.where(has_keys, running_max + tl.log2(tl.where(has_keys, denominator, 1.0)), float("-inf"))
    mid = Mid_Out + seq * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :]
    tl.store(mid, out, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(Mid_Lse + seq * stride_mlb + heads * stride_mlh + split, lse, mask=mask_h)


@triton.jit
def _decode_merge_kernel(
    Mid_Out, Mid_Lse, Out,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    num_splits, head_dim,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim

    lse = tl.load(Mid_Lse + seq * stride_mlb + head * stride_mlh + offs_s, mask=mask_s, other=float("-inf"))
    max_lse = tl.max(lse, axis=0)
    # Every split is empty only for a padding row with seq_len 0: it gets zeros, not NaN.
    weights = tl.exp2(lse - tl.where(max_lse == float("-inf"), 0.0, max_lse))
    partial = tl.load(Mid_Out + seq * stride_mob + head * stride_moh + offs_s[:, None] * stride_mos
                      + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    total = tl.sum(weights, axis=0)
    out = tl.sum(weights[:, None] * partial, axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(Out + seq * stride_ob + head * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=mask_d)


def _num_splits(device: torch.device, num_programs: int, max_seqlen_k: int) -> int:
    """Enough splits to give every SM two programs, none shorter than _MIN_TOKENS_PER_SPLIT keys.

    Two, not more: on an H100 (batch 64 x 2048, 512 programs without splitting) one split reached 2709 GB/s,
    two 2651, four 2573 (benchmarks/kernels.py); the merge and the partial outputs cost more than the
    extra programs gain once every SM has work."""
    by_length = triton.cdiv(max(max_seqlen_k, 1), _MIN_TOKENS_PER_SPLIT)
    if device.type != "cuda":
        return min(by_length, 4)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    by_occupancy = triton.cdiv(2 * num_sms, num_programs)
    return max(1, min(by_length, by_occupancy, _MAX_SPLITS))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float, sliding_window: int | None = None, *, k_scale: float = 1.0, v_scale: float = 1.0,
                     num_kv_splits: int | None = None, config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Attention of each sequence's one query token over its paged KV; returns `[num_seqs, H, D]`.

    An FP8 cache holds K / k_scale and V / v_scale: its tiles are converted to q's dtype as they are read,
    k_scale is folded into the softmax scale and v_scale into the partial outputs.

    `num_kv_splits` overrides the split heuristic, `config` the split kernel's `(BLOCK_N, num_warps,
    num_stages[, k_rows_first[, fp16_tiles]])` (tests and benchmarks' sweeps; k_rows_first loads K tiles as
    stored and transposes them in registers; fp16_tiles, for an FP8 cache under a bf16 query, converts the
    tiles to fp16, exactly, and the query to fp16 for the dots, instead of both to bf16).
    """
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, page_size, num_kv_heads, cache_head_dim = k_cache.shape
    assert v_cache.shape == k_cache.shape, "k_cache and v_cache must have the same shape"
    assert cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} != query head_dim {head_dim}"
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads not a multiple of {num_kv_heads} KV heads"
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in (q.dtype, FP8_DTYPE), \
        f"the caches must be in q's dtype or {FP8_DTYPE}, got {k_cache.dtype} / {v_cache.dtype}"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "need unit stride on head_dim"
    assert meta.seq_lens.shape == (num_seqs,) and meta.block_tables.shape[0] == num_seqs
    assert meta.seq_lens.dtype == torch.int32 and meta.block_tables.dtype == torch.int32
    assert meta.block_tables.stride(-1) == 1, "block_tables needs a unit stride on its last dim"
    assert sliding_window is None or sliding_window > 0
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out

    group = num_heads // num_kv_heads
    block_h = min(max(16, triton.next_power_of_2(group)), 64)
    head_blocks = triton.cdiv(group, block_h)
    block_d = triton.next_power_of_2(head_dim)
    num_programs = num_seqs * num_kv_heads * head_blocks
    num_splits = num_kv_splits or _num_splits(q.device, num_programs, meta.max_seqlen_k)

    # An FP8 cache: 128 keys a tile, converted to fp16 (H100, batch 64 x 2048: 141 us against 167 converting to
    # bf16 and 200 for the bf16 cache; benchmarks/kernels.py --decode-only --sweep, docs/gpu-logs/2026-11-27-h100).
    default = (128, 4, 2, False, True) if k_cache.dtype == FP8_DTYPE else (64, 4, 2, False, False)
    block_n, num_warps, num_stages, k_rows_first, fp16_tiles = (*config, False, False)[:5] if config else default
    fp16_tiles = fp16_tiles and k_cache.dtype == FP8_DTYPE and q.dtype == torch.bfloat16
    mid_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(num_seqs, num_kv_heads * head_blocks, num_splits)](
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, mid_out, mid_lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        scale * k_scale * _LOG2E, v_scale, sliding_window or 0, num_splits, head_dim,
        GROUP=group,
        PAGE_SIZE=page_size,
        HAS_WINDOW=sliding_window is not None,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        K_ROWS_FIRST=k_rows_first,
        FP16_TILES=fp16_tiles,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    _decode_merge_kernel[(num_seqs, num_heads)](
        mid_out, mid_lse, out,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        num_splits, head_dim,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
        num_warps=4 if block_d >= 128 else 2,
    )
    return out
