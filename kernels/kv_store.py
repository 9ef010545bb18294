"""Write this step's new K/V into the paged cache through a slot mapping (Triton).

Scope and assumptions:
- `key`/`value` are `[num_tokens, num_kv_heads, head_dim]` with a unit stride on `head_dim` (views of a
  fused QKV output are fine: token and head strides are passed explicitly).
- `k_cache`/`v_cache` are `[num_blocks, block_size, num_kv_heads, head_dim]`, unit stride on `head_dim`;
  slot `s` is block `s // block_size`, offset `s % block_size`.
- `slot_mapping` is int64 (or int32) `[num_tokens]`; a slot of -1 skips the token (padding, CUDA graphs).
- An FP8 cache (`FP8_DTYPE`) stores K / k_scale and V / v_scale, saturated to +-FP8_MAX.
One program copies one token's K and V, all heads at once.
"""
import torch
import triton
import triton.language as tl

from kubeinfer.kernels.metadata import FP8_DTYPE, FP8_MAX

FP8_LIMIT = tl.constexpr(FP8_MAX)


@triton.jit
def _to_e4m3_grid(x):
    """`x` (fp32, within +-FP8_MAX) rounded to the nearest e4m3 value, ties to even (as torch's and the GPU's own
    conversions round), so that the cast to FP8 that follows is exact. Rounding here rather than in the cast: the
    Triton interpreter's own fp32 -> FP8 rounding loses the carry into the exponent (7.97 became 4.0, not 8.0).
    Ties are common: a bf16 input has 8 significant bits, e4m3 keeps 4 (on an H200, ties away from zero made
    6 of 6 store tests differ from torch)."""
    magnitude = tl.abs(x)
    # The exponent from the bits, not floor(log2): the GPU's log2 is an approximation (lg2.approx), and one just
    # below an integer at a power of 2 would pick the finer step. (A precaution: the H200's remaining mismatches
    # turned out to be -0.0, below.)
    biased = (magnitude.to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = tl.maximum(biased.to(tl.float32) - 127.0, -6.0)                     # below 2^-6: subnormal step
    step = tl.exp2(exponent - 3.0)                                                  # 3 mantissa bits
    steps = magnitude / step                                                        # exact: step is a power of 2
    rounded = tl.floor(steps + 0.5)
    odd_tie = (rounded - steps == 0.5) & (rounded - 2.0 * tl.floor(rounded * 0.5) == 1.0)
    rounded = tl.where(odd_tie, rounded - 1.0, rounded) * step
    # x's sign bit on the rounded magnitude's bits: a negative value that rounds to 0 stays -0.0, as torch gives
    # (negating in Triton compiled to 0 - x on the H200, which is +0.0).
    bits = x.to(tl.int32, bitcast=True)
    return (rounded.to(tl.int32, bitcast=True) | (bits - (bits & 0x7FFFFFFF))).to(tl.float32, bitcast=True)


@triton.jit
def _store_kv_kernel(
    Key, Value, K_Cache, V_Cache, Slot_Mapping,
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    num_kv_heads, head_dim, k_scale_inv, v_scale_inv,
    FP8: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(Slot_Mapping + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)

    k = tl.load(Key + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(Value + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    k_dst = K_Cache + block * stride_kcb + offset * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :]
    v_dst = V_Cache + block * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :]
    if FP8:
        k = _to_e4m3_grid(tl.minimum(tl.maximum(k.to(tl.float32) * k_scale_inv, -FP8_LIMIT), FP8_LIMIT))
        v = _to_e4m3_grid(tl.minimum(tl.maximum(v.to(tl.float32) * v_scale_inv, -FP8_LIMIT), FP8_LIMIT))
    tl.store(k_dst, k.to(K_Cache.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(V_Cache.dtype.element_ty), mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write each token's K/V into its slot of the paged cache; tokens with slot -1 are skipped. The scales
    apply to an FP8 cache only."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape, f"value {tuple(value.shape)} != key {tuple(key.shape)}"
    assert k_cache.shape == v_cache.shape and k_cache.dim() == 4, "caches must be [blocks, block_size, kv_heads, dim]"
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), \
        f"cache heads/dim {tuple(k_cache.shape[2:])} != key {(num_kv_heads, head_dim)}"
    assert slot_mapping.shape == (num_tokens,), f"slot_mapping {tuple(slot_mapping.shape)} != ({num_tokens},)"
    assert slot_mapping.dtype in (torch.int32, torch.int64)
    assert key.dtype == value.dtype and k_cache.dtype == v_cache.dtype and k_cache.dtype in (key.dtype, FP8_DTYPE)
    for name, t in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        assert t.stride(-1) == 1, f"{name} needs a unit stride on head_dim"
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1),
        value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_kv_heads, head_dim, 1.0 / k_scale, 1.0 / v_scale,
        FP8=k_cache.dtype == FP8_DTYPE,
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
