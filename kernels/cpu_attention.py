"""Paged attention on the CPU, in place over the paged cache: the launcher of `csrc/paged_attention_cpu.c`.

Scope: an fp32 or a bf16 cache (`csrc/paged_attention_cpu_bf16kv.c`: rows widened to fp32 as they are read; other
cache dtypes, FP8 included, take the PyTorch reference); fp32 queries, or 16-bit ones (converted to fp32, the output
back to their dtype); decode, speculative verification and prefill chunks, mixed in one call; GQA; sliding window. `references.paged_attention` defines
the result; tests compare the two on odd shapes.
"""
import ctypes

import torch

from kubeinfer.kernels import cpu_native
from kubeinfer.kernels.metadata import AttentionMetadata

MAX_HEAD_DIM = 256
QUERY_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# cache dtype -> (library, function)
KERNELS = {torch.float32: ("paged_attention_cpu", "kubeinfer_paged_attention_f32"),
           torch.bfloat16: ("paged_attention_cpu_bf16kv", "kubeinfer_paged_attention_bf16kv")}
_functions: dict[torch.dtype, object] = {}


def kernel_function(lib: ctypes.CDLL | None, cache_dtype: torch.dtype):
    """The kernel function for `cache_dtype` of a loaded library (`KERNELS`), its arguments declared; None without
    the library."""
    if lib is None:
        return None
    function = getattr(lib, KERNELS[cache_dtype][1])
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
    function.argtypes = [p, i64, p, p, p, p, p, i64, i32, i32, i32, i32, i32, f32, i32, p]
    function.restype = ctypes.c_int
    return function


def _kernel(cache_dtype: torch.dtype):
    if cache_dtype not in _functions:
        function = kernel_function(cpu_native.library(KERNELS[cache_dtype][0]), cache_dtype)
        if function is None:
            return None
        _functions[cache_dtype] = function
    return _functions[cache_dtype]


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether this kernel can run these tensors (and was built on this machine)."""
    return (q.device.type == "cpu" and q.dtype in QUERY_DTYPES and k_cache.dtype in KERNELS
            and q.shape[-1] <= MAX_HEAD_DIM and _kernel(k_cache.dtype) is not None)


def _step_arrays(meta: AttentionMetadata, num_tokens: int) -> tuple[torch.Tensor, ...]:
    """(cu_seqlens_q, seq_lens, block_tables) as the kernel reads them: int32, contiguous. Checked once a forward
    (every layer shares `meta`; this cost ~10 us a layer) when they already are: later layers then read the very
    same tensors. Converted copies are made again by each layer, never cached."""
    sources = (meta.cu_seqlens_q, meta.seq_lens, meta.block_tables)
    checked = meta.__dict__.get("_cpu_checked")
    if checked is not None and all(a is b for a, b in zip(checked, sources)):
        return sources
    arrays = tuple(t.to(torch.int32).contiguous() for t in sources)
    assert arrays[0].numel() == arrays[1].numel() + 1 and int(arrays[0][-1]) == num_tokens
    if all(a is b for a, b in zip(arrays, sources)):
        meta.__dict__["_cpu_checked"] = sources
    return arrays


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, sliding_window: int | None = None) -> torch.Tensor:
    """q `[num_tokens, H, D]` -> `[num_tokens, H, D]`, as `references.paged_attention` defines it."""
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    assert cache_head_dim == head_dim and v_cache.shape == k_cache.shape, (q.shape, k_cache.shape, v_cache.shape)
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads over {num_kv_heads} KV heads"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the paged cache must be contiguous"
    assert v_cache.dtype == k_cache.dtype, (k_cache.dtype, v_cache.dtype)
    dtype = q.dtype
    if dtype != torch.float32:
        q = q.float()
    elif q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    cu_seqlens_q, seq_lens, tables = _step_arrays(meta, num_tokens)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)   # q is fp32 here
    status = _kernel(k_cache.dtype)(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), cu_seqlens_q.data_ptr(),
                       seq_lens.data_ptr(), tables.data_ptr(), tables.stride(0) if tables.dim() == 2 else 0,
                       seq_lens.numel(), num_heads, num_kv_heads, head_dim, block_size, scale,
                       sliding_window or 0, out.data_ptr())
    assert status == 0, f"paged_attention_cpu refused the shapes (status {status})"
    return out if dtype == torch.float32 else out.to(dtype)
