"""RMSNorm with an optional fused residual add (Triton).

Scope and assumptions:
- `x` is `[..., hidden]` with a unit stride on `hidden`; leading dims are flattened to rows (a copy is
  made only if they cannot be viewed as one). `weight` is `[hidden]`, `residual` matches `x`.
- Semantics follow `references.rms_norm` (Llama's): with a residual, `x + residual` is rounded to the
  input dtype first and returned as the new residual; statistics run in fp32; the normalised row is
  rounded to the input dtype before the weight multiplies it; the output dtype is the promotion of
  `x` and `weight`.
- One program normalises one row held whole in registers (hidden up to 64K elements).
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    X, Residual, Weight, Out, Residual_Out,
    stride_x, stride_r, stride_o, stride_ro,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < hidden

    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(Residual_Out + row * stride_ro + offs, x, mask=mask)

    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, axis=0) / hidden
    normed = (x32 * tl.rsqrt(mean_square + eps)).to(X.dtype.element_ty)
    w = tl.load(Weight + offs, mask=mask, other=0.0)
    out = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(Out + row * stride_o + offs, out.to(Out.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of `x`; with `residual`, returns `(rms_norm(x + residual), x + residual)`."""
    hidden = x.shape[-1]
    assert weight.shape == (hidden,), f"weight {tuple(weight.shape)} != ({hidden},)"
    assert x.stride(-1) == 1 and weight.stride(-1) == 1, "x and weight need a unit stride on the last dim"
    x2 = x.reshape(-1, hidden)
    num_rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    out2 = out.view(-1, hidden)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x"
        assert residual.stride(-1) == 1, "residual needs a unit stride on the last dim"
        r2 = residual.reshape(-1, hidden)
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        ro2 = residual_out.view(-1, hidden)
    else:
        r2 = ro2 = x2  # unused: HAS_RESIDUAL is off
    block_n = triton.next_power_of_2(hidden)
    assert block_n <= 65536, f"hidden size {hidden} too large for one row per program"
    if num_rows > 0:
        _rms_norm_kernel[(num_rows,)](
            x2, r2, weight, out2, ro2,
            x2.stride(0), r2.stride(0), out2.stride(0), ro2.stride(0),
            hidden, eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK_N=block_n,
            num_warps=min(max(block_n // 256, 1), 16),
        )
    return out if residual is None else (out, residual_out)
