"""SiLU-and-mul, the gated MLP activation of Llama-family models (Triton).

Scope and assumptions:
- `x` is `[..., 2 * d]` (gate | up, as the fused gate_up projection writes it) with a unit stride on the
  last dim; leading dims are flattened to rows. Returns `silu(gate) * up` as `[..., d]` in `x`'s dtype.
- The activation runs in fp32 and is rounded once.
Grid: one program per (row, BLOCK_D slice of d).
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(
    X, Out,
    stride_x, stride_o,
    d,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = offs < d
    gate = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(Out + row * stride_o + offs, out.to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for `x` of last size `2d`."""
    assert x.shape[-1] % 2 == 0, f"last dim {x.shape[-1]} must be even"
    assert x.stride(-1) == 1, "x needs a unit stride on the last dim"
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    out2 = out.view(-1, d)
    if x2.shape[0] == 0 or d == 0:
        return out
    block_d = min(triton.next_power_of_2(d), 4096 if x.is_cuda else 65536)
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block_d))](
        x2, out2, x2.stride(0), out2.stride(0), d,
        BLOCK_D=block_d,
        num_warps=min(max(block_d // 256, 1), 8),
    )
    return out
