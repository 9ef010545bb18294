"""Paged attention on the CPU, in place over the paged cache: the launcher of `csrc/paged_attention_cpu.c`.

Scope: fp32 queries and cache (other dtypes, FP8 included, take the PyTorch reference); decode, speculative
verification and prefill chunks, mixed in one call; GQA; sliding window. `references.paged_attention` defines
the result; tests compare the two on odd shapes.

Long prefill chunks (LONG_CHUNK query tokens or more) run as GEMMs instead (`_long_chunk`: MKL's sgemm through
torch, 90-106 GFLOP/s from 512 tokens on the 2-core box against 49 for the C tiles); the C kernel takes every
other sequence of the batch in the same call.
"""
import ctypes

import torch

from kubeinfer.kernels import cpu_native, references
from kubeinfer.kernels.metadata import AttentionMetadata

MAX_HEAD_DIM = 256
LONG_CHUNK = 256      # query tokens from which a chunk runs as GEMMs (C tiles win below: 23 GFLOP/s at 128)
QUERY_BLOCK = 256     # query tokens per GEMM block: bounds the scores to [KVH, 256 x group, keys]
_function = None


def _kernel():
    global _function
    if _function is None:
        lib = cpu_native.library("paged_attention_cpu")
        if lib is None:
            return None
        function = lib.kubeinfer_paged_attention_f32
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
        function.argtypes = [p, i64, p, p, p, p, p, i64, i32, i32, i32, i32, i32, f32, i32, i32, p]
        function.restype = ctypes.c_int
        _function = function
    return _function


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether this kernel can run these tensors (and was built on this machine)."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype == torch.float32
            and q.shape[-1] <= MAX_HEAD_DIM and _kernel() is not None)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, sliding_window: int | None = None) -> torch.Tensor:
    """q `[num_tokens, H, D]` -> `[num_tokens, H, D]`, as `references.paged_attention` defines it."""
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    assert cache_head_dim == head_dim and v_cache.shape == k_cache.shape, (q.shape, k_cache.shape, v_cache.shape)
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads over {num_kv_heads} KV heads"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the paged cache must be contiguous"
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    cu_seqlens_q = meta.cu_seqlens_q.to(torch.int32).contiguous()
    seq_lens = meta.seq_lens.to(torch.int32).contiguous()
    tables = meta.block_tables.to(torch.int32).contiguous()
    assert cu_seqlens_q.numel() == seq_lens.numel() + 1 and int(cu_seqlens_q[-1]) == num_tokens
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32)
    long_chunks = meta.max_seqlen_q >= LONG_CHUNK
    status = _kernel()(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), cu_seqlens_q.data_ptr(),
                       seq_lens.data_ptr(), tables.data_ptr(), tables.stride(0) if tables.dim() == 2 else 0,
                       seq_lens.numel(), num_heads, num_kv_heads, head_dim, block_size, scale,
                       sliding_window or 0, LONG_CHUNK if long_chunks else 0, out.data_ptr())
    assert status == 0, f"paged_attention_cpu refused the shapes (status {status})"
    if long_chunks:
        starts, lengths = cu_seqlens_q.tolist(), seq_lens.tolist()
        for i, seq_len in enumerate(lengths):
            begin, end = starts[i], starts[i + 1]
            if end - begin >= LONG_CHUNK:
                out[begin:end] = _long_chunk(q[begin:end], k_cache, v_cache, tables[i], seq_len, scale,
                                             sliding_window)
    return out


def _long_chunk(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, seq_len: int,
                scale: float, sliding_window: int | None) -> torch.Tensor:
    """One sequence's chunk of n queries (its last n positions) over its first `seq_len` keys, as batched GEMMs
    per KV head: scores = Q K^T, masked (causal, window), softmax, times V; QUERY_BLOCK queries at a time, each
    block against only the keys it can see."""
    num_q, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    keys_t = references._gather_kv(k_cache, table, seq_len).permute(1, 2, 0)     # [KVH, D, L]
    values = references._gather_kv(v_cache, table, seq_len).permute(1, 0, 2)     # [KVH, L, D]
    out = torch.empty_like(q)
    first_pos = seq_len - num_q
    for start in range(0, num_q, QUERY_BLOCK):
        end = min(num_q, start + QUERY_BLOCK)
        lo = 0 if sliding_window is None else max(0, first_pos + start - sliding_window + 1)
        hi = first_pos + end                                               # keys [lo, hi) are seen by some query
        rows = q[start:end].reshape(end - start, num_kv_heads, group, head_dim).permute(1, 0, 2, 3)
        scores = torch.bmm(rows.reshape(num_kv_heads, -1, head_dim) * scale, keys_t[:, :, lo:hi])
        query_pos = torch.arange(first_pos + start, first_pos + end).repeat_interleave(group).view(-1, 1)
        visible = references._visible(query_pos, torch.arange(lo, hi).view(1, -1), sliding_window)
        scores.masked_fill_(~visible, float("-inf"))   # every query sees itself: no row is all -inf
        mixed = torch.bmm(torch.softmax(scores, dim=-1), values[:, lo:hi])  # [KVH, (end-start) x group, D]
        out[start:end] = mixed.view(num_kv_heads, end - start, group, head_dim).permute(1, 0, 2, 3).reshape(
            end - start, num_heads, head_dim)
    return out
