"""RMSNorm, rotary embedding, SiLU-and-mul, the paged K/V store and a row's argmax on the CPU, one pass each: the
launcher of `csrc/elementwise_cpu.c`.

Scope: fp32 or bf16 CPU tensors whose last dimension is contiguous, all of a call in one dtype (others take the
PyTorch references; bf16 rounds where the reference does, see the C source). Each
function returns None when the kernel cannot run these tensors, and the caller then takes the reference, which
defines the result.
"""
import ctypes

import torch

from kubeinfer.kernels import cpu_native

_functions: dict[str, ctypes._CFuncPtr] | None = None


def _kernels() -> dict | None:
    global _functions
    if _functions is None:
        lib = cpu_native.library("elementwise_cpu")
        if lib is None:
            return None
        p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        i32 = ctypes.c_int32
        signatures = {
            "kubeinfer_rms_norm": [p, i64, i64, i64, i64, p, p, i64, f32, p, p, i32],
            "kubeinfer_rotary": [p, i64, p, i64, i64, p, i64, i64, i64, p, p, p, i32],
            "kubeinfer_silu_and_mul": [p, i64, i64, i64, p, i32],
            "kubeinfer_store_kv": [p, i64, p, i64, p, p, p, i64, i64, i64],
            "kubeinfer_argmax": [p, i64, i64, i64, p],
        }
        functions = {}
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
            functions[name] = function
        _functions = functions
    return _functions


DTYPES = (torch.float32, torch.bfloat16)


def _runs(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: CPU, one supported dtype, last dimension contiguous."""
    dtype = tensors[0].dtype
    if dtype not in DTYPES:
        return False
    for t in tensors:   # a loop of cheap attributes: it runs a few times a layer a step (`device` builds an object)
        if t.dtype != dtype or not t.is_cpu or t.stride(-1) != 1:
            return False
    return _kernels() is not None


def _dense_like(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape and dtype (empty_like: half the Python cost of empty(shape, dtype=))."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _row_strides(x: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(outer, inner, outer stride, inner stride) addressing every row of `x`'s last dimension, or None."""
    if x.dim() == 1:
        return 1, 1, 0, 0
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    if x.dim() == 3:
        return x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """As `references.rms_norm`; None where this kernel does not apply."""
    strides = _row_strides(x)
    if strides is None or not _runs(x, weight) or weight.shape != x.shape[-1:] or not weight.is_contiguous():
        return None
    if residual is not None:
        if residual.shape != x.shape or not _runs(residual):
            return None
        residual = residual.contiguous()
    out = _dense_like(x)
    kept = _dense_like(x) if residual is not None else None
    status = _kernels()["kubeinfer_rms_norm"](
        x.data_ptr(), *strides, residual.data_ptr() if residual is not None else None, weight.data_ptr(),
        x.shape[-1], eps, out.data_ptr(), kept.data_ptr() if kept is not None else None, x.dtype == torch.bfloat16)
    assert status == 0
    return out if residual is None else (out, kept)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """As `references.rotary_embedding` for q `[T, H, D]` and k `[T, KVH, D]` whose heads are contiguous within a
    token (views split out of the QKV projection qualify); None where this kernel does not apply."""
    if (q.dim() != 3 or k.dim() != 3 or not _runs(q, k) or cos_sin_cache.dtype != torch.float32
            or not cos_sin_cache.is_contiguous()):
        return None
    tokens, q_heads, d = q.shape
    if (k.shape[0] != tokens or k.shape[2] != d or d % 2 or cos_sin_cache.shape[-1] != d
            or q.stride(1) != d or k.stride(1) != d):
        return None
    positions = positions.to(torch.int64).contiguous()
    q_out, k_out = _dense_like(q), _dense_like(k)
    status = _kernels()["kubeinfer_rotary"](
        positions.data_ptr(), tokens, q.data_ptr(), q.stride(0), q_heads, k.data_ptr(), k.stride(0), k.shape[1], d,
        cos_sin_cache.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), q.dtype == torch.bfloat16)
    assert status == 0
    return q_out, k_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """As `references.silu_and_mul`; None where this kernel does not apply."""
    if x.dim() < 1 or x.shape[-1] % 2 or not _runs(x):
        return None
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x   # a view for any x whose rows are evenly spaced
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype)
    status = _kernels()["kubeinfer_silu_and_mul"](rows.data_ptr(), rows.shape[0], rows.stride(0), d, out.data_ptr(),
                                                  x.dtype == torch.bfloat16)
    assert status == 0
    return out


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> bool:
    """As `references.store_kv` for key and value `[T, KVH, D]` in the caches' dtype, each token's heads contiguous
    (views split out of the QKV projection qualify), into contiguous caches; False (nothing written) where this
    kernel does not apply. Replaces six to eight tensor ops a layer (a mask, its check, two index copies)."""
    if (key.dim() != 3 or value.shape != key.shape or v_cache.shape != k_cache.shape
            or not _runs(key, value, k_cache, v_cache) or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        return False
    tokens, heads, d = key.shape
    if (heads * d != k_cache.shape[2] * k_cache.shape[3] or key.stride(1) != d or value.stride(1) != d
            or slot_mapping.shape != (tokens,)):
        return False
    row = heads * d
    slots = slot_mapping
    if slots.dtype != torch.int64 or not slots.is_contiguous():
        slots = slots.to(torch.int64).contiguous()
    status = _kernels()["kubeinfer_store_kv"](
        key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        slots.data_ptr(), tokens, row, key.element_size())
    assert status == 0
    return True


def argmax(x: torch.Tensor) -> torch.Tensor | None:
    """`x.argmax(dim=-1)` of a 2-D fp32 CPU tensor whose rows are contiguous (a step's logits), in one pass a row:
    torch's reads 152k-value rows at a third of the memory's rate (11 ms for 64 rows on the 2-vCPU box, measured
    2026-12-01). The same index, ties and NaN included; None where this kernel does not apply."""
    if x.dim() != 2 or x.dtype != torch.float32 or not _runs(x) or x.shape[0] == 0 or x.shape[1] == 0:
        return None
    out = torch.empty(x.shape[0], dtype=torch.int64)
    if _kernels()["kubeinfer_argmax"](x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr()):
        return None
    return out
