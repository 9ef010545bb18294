"""Rotary position embedding, Llama/NeoX layout (rotate halves), from a precomputed cos/sin cache (Triton).

Scope and assumptions:
- `q` is `[num_tokens, num_heads, head_dim]`, `k` is `[num_tokens, num_kv_heads, head_dim]`, each with a
  unit stride on `head_dim` (views of a fused QKV output are fine); `head_dim` is even.
- `cos_sin_cache` is `[max_positions, head_dim]`: cos in the first half, sin in the second (one value per
  rotated pair), built by the runtime with any frequency scaling already applied (Llama 3, linear, ...).
- `positions` is `[num_tokens]`, int32 or int64.
- Returns new tensors (the inputs are not modified). The rotation runs in fp32 and is rounded once.
One program rotates every query and key head of one token.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(X, Out, token, stride_xt, stride_xh, stride_ot, stride_oh, num_heads, cos, sin,
                  half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < half)
    src = X + token * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    dst = Out + token * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(Out.dtype.element_ty), mask=mask)
    tl.store(dst + half, (x2 * cos + x1 * sin).to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    Positions, Q, K, Cos_Sin_Cache, Q_Out, K_Out,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_cache,
    num_heads, num_kv_heads, half,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(Positions + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < half
    cos = tl.load(Cos_Sin_Cache + pos * stride_cache + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(Cos_Sin_Cache + pos * stride_cache + half + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(Q, Q_Out, token, stride_qt, stride_qh, stride_qot, stride_qoh, num_heads, cos, sin, half,
                  BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(K, K_Out, token, stride_kt, stride_kh, stride_kot, stride_koh, num_kv_heads, cos, sin, half,
                  BLOCK_HK, BLOCK_HALF)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `q` and `k` by their tokens' positions; returns `(q_rotated, k_rotated)`."""
    assert q.dim() == 3 and k.dim() == 3, "q and k must be [num_tokens, heads, head_dim]"
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert k.shape == (num_tokens, num_kv_heads, head_dim), f"k {tuple(k.shape)} does not match q {tuple(q.shape)}"
    assert head_dim % 2 == 0, f"head_dim {head_dim} must be even"
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim, \
        f"cos_sin_cache {tuple(cos_sin_cache.shape)} must be [max_positions, {head_dim}]"
    assert positions.shape == (num_tokens,) and positions.dtype in (torch.int32, torch.int64)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1, "need unit stride on head_dim"
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    block_hq = triton.next_power_of_2(num_heads)
    block_half = triton.next_power_of_2(half)
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cos_sin_cache, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos_sin_cache.stride(0),
        num_heads, num_kv_heads, half,
        BLOCK_HQ=block_hq,
        BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=block_half,
        num_warps=4 if block_hq * block_half >= 1024 else 1,
    )
    return q_out, k_out
