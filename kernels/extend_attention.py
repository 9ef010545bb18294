"""Paged prefill/extend attention: variable-length query chunks against paged KV (Triton).

Scope and assumptions:
- Covers prefill, chunked prefill, prefix-cache hits and decode rows mixed in one batch. Sequence `i`
  owns query tokens `cu_seqlens_q[i]:cu_seqlens_q[i+1]` of `q` (`[num_tokens, num_heads, head_dim]`,
  unit stride on `head_dim`): the last `n` of its first `seq_lens[i]` tokens, whose K/V (this chunk's
  included) are already in the cache. Query `j` sits at `seq_lens[i] - n + j` (causal offset) and sees
  keys up to that position, only the last `sliding_window` of them when a window is set (Mistral).
- `k_cache`/`v_cache` are `[num_blocks, block_size, num_kv_heads, head_dim]` (any block size; unit stride
  on `head_dim`); `block_tables` int32 `[num_seqs, max_blocks]`; `cu_seqlens_q`, `seq_lens` int32.
- Grouped-query attention: query head `h` reads KV head `h // (num_heads // num_kv_heads)`.

Grid `(num_seqs, num_heads, cdiv(max_seqlen_q, BLOCK_M))`: a program takes BLOCK_M queries of one head
and runs an online softmax over the keys its tile can see, `[first visible, last query + 1)`, gathering
each key's page through the block table. Rows that see no key of a tile keep their state (the running
max is guarded against -inf), so windows narrower than a tile are exact.
"""
import torch
import triton
import triton.language as tl

from kubeinfer.kernels.metadata import FP8_DTYPE, AttentionMetadata

_LOG2E = 1.4426950408889634


@triton.jit
def _load_tile(ptrs, mask_rows, mask_cols, MASKED: tl.constexpr, MASK_D: tl.constexpr):
    """A tile of K or V: `mask_rows`/`mask_cols` are the key and head_dim masks, broadcast to the tile's layout;
    each applies only where it can hide something (MASKED: keys past the end; MASK_D: head_dim < BLOCK_D)."""
    if MASKED and MASK_D:
        return tl.load(ptrs, mask=mask_rows & mask_cols, other=0.0)
    if MASKED:
        return tl.load(ptrs, mask=mask_rows, other=0.0)
    if MASK_D:
        return tl.load(ptrs, mask=mask_cols, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _attend_tile(q, acc, running_max, denominator, start, query_pos, kv_end, sliding_window,
                 K_Cache, V_Cache, table, kv_head, offs_d, mask_d,
                 stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, sm_scale_log2,
                 PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, MASK_D: tl.constexpr,
                 K_ROWS_FIRST: tl.constexpr):
    """One BLOCK_N tile of keys into the online softmax. MASKED=False: every query of the tile sees every key
    (no bounds, causal or window test); MASKED=True: keys past `kv_end`, after a query or outside its window
    are hidden, and rows that see no key yet keep their state. MASK_D=False: head_dim fills BLOCK_D, and loads
    carry no mask along it. K_ROWS_FIRST: K's tile is loaded as stored, `[BLOCK_N, BLOCK_D]`, and transposed in
    registers."""
    offs_n = start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < kv_end
    if MASKED:
        page = tl.load(table + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
    else:
        page = tl.load(table + offs_n // PAGE_SIZE).to(tl.int64)
    in_page = offs_n % PAGE_SIZE
    if K_ROWS_FIRST:
        k = _load_tile(K_Cache + page[:, None] * stride_kb + in_page[:, None] * stride_ks + kv_head * stride_kh
                       + offs_d[None, :], mask_n[:, None], mask_d[None, :], MASKED, MASK_D)
        k = tl.trans(k.to(q.dtype))
    else:
        k = _load_tile(K_Cache + page[None, :] * stride_kb + in_page[None, :] * stride_ks + kv_head * stride_kh
                       + offs_d[:, None], mask_n[None, :], mask_d[:, None], MASKED, MASK_D)
        k = k.to(q.dtype)   # an FP8 cache's tile, in q's dtype (a no-op for a 16/32-bit cache)
    v_ptrs = V_Cache + page[:, None] * stride_vb + in_page[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :]
    # Raw scores; the running max is kept in scaled (log2) units: max(scores) * scale is the max of the scaled
    # scores (scale > 0), and each probability's scale-and-subtract is one fused multiply-add.
    scores = tl.dot(q, k, input_precision=DOT_PRECISION)      # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = mask_n[None, :] & (offs_n[None, :] <= query_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > query_pos[:, None] - sliding_window)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1) * sm_scale_log2)
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)            # rows with no key yet
    else:
        new_max = tl.maximum(running_max, tl.max(scores, axis=1) * sm_scale_log2)
        safe_max = new_max
    rescale = tl.exp2(running_max - safe_max)
    probs = tl.exp2(scores * sm_scale_log2 - safe_max[:, None])
    denominator = denominator * rescale + tl.sum(probs, axis=1)
    v = _load_tile(v_ptrs, mask_n[:, None], mask_d[None, :], MASKED, MASK_D).to(q.dtype)
    acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, new_max, denominator


@triton.jit
def _extend_kernel(
    Q, K_Cache, V_Cache, Out, Cu_Seqlens_Q, Seq_Lens, Block_Tables,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    sm_scale_log2, v_scale, sliding_window, head_dim,
    GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASK_D: tl.constexpr,
    K_ROWS_FIRST: tl.constexpr,
    PACK_GQA: tl.constexpr,
):
    # PACK_GQA: a program takes BLOCK_M // GROUP queries of every head of one KV group (row r: query r // GROUP,
    # head r % GROUP of the group), so each K/V tile it loads serves the whole group; else BLOCK_M queries of one
    # head. Every mask below works row by row (each row's own query position), so both layouts share them.
    seq = tl.program_id(0)
    m_block = tl.num_programs(2) - 1 - tl.program_id(2)     # the longest (last) query tiles start first
    q_begin = tl.load(Cu_Seqlens_Q + seq)
    q_len = tl.load(Cu_Seqlens_Q + seq + 1) - q_begin
    tile_queries = BLOCK_M // GROUP if PACK_GQA else BLOCK_M
    if m_block * tile_queries >= q_len:
        return
    seq_len = tl.load(Seq_Lens + seq)
    rows = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        kv_head = tl.program_id(1)
        heads = kv_head * GROUP + rows % GROUP
        offs_m = m_block * tile_queries + rows // GROUP
    else:
        kv_head = tl.program_id(1) // GROUP
        heads = tl.program_id(1) + rows * 0
        offs_m = m_block * BLOCK_M + rows
    mask_m = offs_m < q_len
    query_pos = seq_len - q_len + offs_m
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q_rows = (q_begin + offs_m).to(tl.int64)
    if MASK_D:
        q_mask = mask_m[:, None] & mask_d[None, :]
    else:
        q_mask = mask_m[:, None]
    q = tl.load(Q + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)

    # Keys this tile can see: causal end at its last query, window start at its first query. Without a
    # window, the tiles of keys at or before the first query's position are visible to every query of this
    # tile: they run without masks; the rest (the diagonal) runs masked.
    first_pos = seq_len - q_len + m_block * tile_queries
    kv_end = tl.minimum(first_pos + tile_queries, seq_len)
    kv_start = 0
    full_end = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(first_pos - sliding_window + 1, 0)
        full_end = kv_start
    else:
        full_end = (first_pos + 1) // BLOCK_N * BLOCK_N
    table = Block_Tables + seq.to(tl.int64) * stride_bt

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denominator = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(kv_start, full_end, BLOCK_N):
        acc, running_max, denominator = _attend_tile(
            q, acc, running_max, denominator, start, query_pos, kv_end, sliding_window,
            K_Cache, V_Cache, table, kv_head, offs_d, mask_d,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, sm_scale_log2,
            PAGE_SIZE, False, HAS_WINDOW, BLOCK_N, DOT_PRECISION, MASK_D, K_ROWS_FIRST)
    for start in range(full_end, kv_end, BLOCK_N):
        acc, running_max, denominator = _attend_tile(
            q, acc, running_max, denominator, start, query_pos, kv_end, sliding_window,
            K_Cache, V_Cache, table, kv_head, offs_d, mask_d,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, sm_scale_log2,
            PAGE_SIZE, True, HAS_WINDOW, BLOCK_N, DOT_PRECISION, MASK_D, K_ROWS_FIRST)

    out = acc * v_scale / tl.where(denominator > 0.0, denominator, 1.0)[:, None]
    tl.store(Out + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=q_mask)


def _block_sizes(q: torch.Tensor, head_dim: int) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages[, k_rows_first, mask_d, pack_gqa]) for this device, dtype, head size.

    Head dim 128 in 16 bits: measured on an H100 (benchmarks/kernels.py --prefill-only --sweep, 4 x 2048 causal,
    Llama-3-8B heads (KV groups of 4), triton 3.6, 2026-11-26, night; docs/gpu-logs/2026-11-26-h100-night/):
    (128, 32, 4, 3) with K's tiles loaded as stored and a KV group's heads packed in a program 0.422 ms (326
    TFLOP/s); K as stored alone 0.455-0.458; as before 0.475-0.481; packed (64, 32, 4, 3) 0.444, packed (128, 128,
    8, 3) 0.469, packed (128, 64, 4, 3) 0.486. Packing applies where the group divides BLOCK_M (measured at 4 only).
    The other rows are not measured yet."""
    if not q.is_cuda:
        return 64, 64, 4, 1              # interpreter: few, large programs
    if q.dtype == torch.float32 or head_dim > 128:
        return 64, 32, 4, 2
    if head_dim > 64:
        return 128, 32, 4, 3, True, False, True
    return 128, 64, 4, 3


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float, sliding_window: int | None = None, *, k_scale: float = 1.0, v_scale: float = 1.0,
                     config: tuple | None = None) -> torch.Tensor:
    """Causal attention of variable-length query chunks over their paged KV; returns `[num_tokens, H, D]`.

    An FP8 cache holds K / k_scale and V / v_scale; its tiles are converted to q's dtype in the kernel, k_scale
    is folded into the softmax scale and v_scale into the output.
    `config` overrides `(BLOCK_M, BLOCK_N, num_warps, num_stages[, k_rows_first[, mask_d[, pack_gqa]]])`
    (benchmarks' sweeps; k_rows_first loads K's tiles as stored, then transposes them; mask_d=True masks loads
    along head_dim even when it fills BLOCK_D, as the kernel did before 2026-11-26, night; pack_gqa puts a KV
    group's heads in one program's rows, where the group divides BLOCK_M)."""
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, page_size, num_kv_heads, cache_head_dim = k_cache.shape
    num_seqs = meta.num_seqs
    assert v_cache.shape == k_cache.shape, "k_cache and v_cache must have the same shape"
    assert cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} != query head_dim {head_dim}"
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads not a multiple of {num_kv_heads} KV heads"
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in (q.dtype, FP8_DTYPE), \
        f"the caches must be in q's dtype or {FP8_DTYPE}, got {k_cache.dtype} / {v_cache.dtype}"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "need unit stride on head_dim"
    assert meta.cu_seqlens_q.shape == (num_seqs + 1,) and meta.block_tables.shape[0] == num_seqs
    for name in ("cu_seqlens_q", "seq_lens", "block_tables"):
        assert getattr(meta, name).dtype == torch.int32, f"meta.{name} must be int32"
    assert meta.block_tables.stride(-1) == 1, "block_tables needs a unit stride on its last dim"
    assert sliding_window is None or sliding_window > 0
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_tokens == 0 or num_seqs == 0:
        return out

    block_m, block_n, num_warps, num_stages, *flags = config or _block_sizes(q, head_dim)
    block_d = triton.next_power_of_2(head_dim)
    k_rows_first = bool(flags[0]) if flags else False
    mask_d = head_dim != block_d or (len(flags) > 1 and bool(flags[1]))   # never unmasked where it would read past
    group = num_heads // num_kv_heads
    pack_gqa = len(flags) > 2 and bool(flags[2]) and group > 1 and block_m % group == 0
    tile_queries = block_m // group if pack_gqa else block_m
    grid = (num_seqs, num_kv_heads if pack_gqa else num_heads, triton.cdiv(meta.max_seqlen_q, tile_queries))
    _extend_kernel[grid](
        q, k_cache, v_cache, out, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables,
        q.stride(0), q.stride(1),
        out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0),
        scale * k_scale * _LOG2E, v_scale, sliding_window or 0, head_dim,
        GROUP=group,
        PAGE_SIZE=page_size,
        HAS_WINDOW=sliding_window is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        MASK_D=mask_d,
        K_ROWS_FIRST=k_rows_first,
        PACK_GQA=pack_gqa,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
