"""`x @ w.T (+ bias)` for the few rows of a decode step: each program streams whole rows of the weight (Triton).

Why: a decode step at batch 1 is its weights' read, and cuBLAS reads them in ways that cost more than the bytes.
On an H100 (benchmarks/decode_profile.py, 8B shape, 2026-11-27) it splits K for the two projections with 4,096
outputs (o_proj, down_proj: 64 launches a step, then 64 of cuBLASLt's `splitKreduce_kernel`, 115 us a step) and
reads qkv_proj at 81% of the copy bandwidth. Here a program owns BLOCK_N output features and loops over all of K
in BLOCK_K tiles of the weight: the weight is read once, in full rows, with nothing to reduce after.

Scope and assumptions:
- `x` is `[M, K]` (leading dims flattened by the caller) with M <= MAX_ROWS; `w` is `[N, K]` as nn.Linear stores
  it; both in one of fp32/fp16/bf16 with a unit stride on K; `bias` `[N]` or None. Out `[M, N]` in x's dtype,
  accumulated in fp32 and rounded once (as cuBLAS does).
- Two ways to multiply: one row (M == 1) by broadcast multiply-adds into a `[BLOCK_N, BLOCK_K]` fp32 tile summed
  once at the end (no tensor cores: a matrix-vector product has nothing for them to share); more rows by
  `tl.dot` on a `[16, BLOCK_K]` tile of x (rows past M are zeros: the weight is read once either way).
Grid: `cdiv(N, BLOCK_N)` programs.
"""
import os

import torch
import triton
import triton.language as tl

MAX_ROWS = 16
# Off: KUBEINFER_SKINNY_LINEAR=0 (every linear layer goes to torch's F.linear, as before 2026-11-27).
ENABLED = os.environ.get("KUBEINFER_SKINNY_LINEAR", "1") != "0"


@triton.jit
def _skinny_linear_kernel(
    X, W, Bias, Out,
    M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr,
    DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    x_rows = X + offs_m[:, None] * stride_xm
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            x_mask = mask_m[:, None]
            w_mask = mask_n[:, None]
        else:
            x_mask = mask_m[:, None] & (offs_k < K)[None, :]
            w_mask = mask_n[:, None] & (offs_k < K)[None, :]
        x = tl.load(x_rows + offs_k[None, :], mask=x_mask, other=0.0)
        if EVEN_N and EVEN_K:
            w = tl.load(w_rows + offs_k[None, :])
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0.0)
        if DOT:
            acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
        else:
            acc += w.to(tl.float32) * x.to(tl.float32)
    if DOT:
        out = acc
    else:
        out = tl.sum(acc, axis=1)[None, :]
    if HAS_BIAS:
        out += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], out.to(Out.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


def default_config(rows: int, n: int, k: int) -> tuple[int, int, int, int, bool]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages, dot) for `rows` rows of x against an `[n, k]` weight.

    Measured on an H100 (benchmarks/skinny_linear.py --sweep --rows 1 4 16, bf16, the 8B shape's five projections,
    triton 3.6, 2026-11-27; docs/gpu-logs/2026-11-27-h100-skinny/): at one row the multiply-add path with
    (8, 512, 4, 3) was the fastest or within 0.6% of it on every projection (qkv 27.1 us, o 21.0, gate_up 89.6, LM
    head 348.4; down, not among its four best, 54.5 in the next call against the sweep's best 54.2): 0.90-0.97x the
    time cuBLAS took. At 4 and 16 rows no launch was the
    best on every projection; tl.dot with (32, 512, 4, 3) took 0.91-1.05x cuBLAS's time at 2-16 rows in the next
    call (qkv 1.00-1.05x, the rest 0.91-0.99x), up to 5% more than a projection's best launch of the sweep. The
    first guess, (32, 256, 4, 4) with tl.dot, took o_proj at 16 rows 46.6 us against cuBLAS's 23.4."""
    if rows == 1:
        return 8, 512, 4, 3, False
    return 32, 512, 4, 3, True


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `skinny_linear` takes this product: a CUDA tensor of at most MAX_ROWS rows, a plain 16-bit weight in
    x's dtype with unit stride on K."""
    return (ENABLED and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
            and weight.dim() == 2 and weight.stride(1) == 1 and x.numel() // max(x.shape[-1], 1) <= MAX_ROWS)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: tuple | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x of at most MAX_ROWS rows (leading dims flattened). `config` overrides
    `(BLOCK_N, BLOCK_K, num_warps, num_stages[, dot])` (the benchmark's sweep; dot defaults to rows > 1)."""
    n, k = weight.shape
    assert x.shape[-1] == k, f"x's last dim {x.shape[-1]} != the weight's in-features {k}"
    assert x.dtype == weight.dtype and x.dtype in (torch.float32, torch.float16, torch.bfloat16), \
        f"x and weight must share a float dtype, got {x.dtype} / {weight.dtype}"
    assert weight.stride(1) == 1, "the weight needs a unit stride on its in-features"
    assert bias is None or bias.shape == (n,), f"bias must be [{n}]"
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    assert rows <= MAX_ROWS, f"{rows} rows: skinny_linear takes at most {MAX_ROWS}"
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return out.view(*x.shape[:-1], n)
    block_n, block_k, num_warps, num_stages, *dot = config or default_config(rows, n, k)
    use_dot = bool(dot[0]) if dot else rows > 1
    if rows > 1 and not use_dot:
        raise ValueError("the multiply-add path takes one row; use dot=True for more")
    _skinny_linear_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, bias if bias is not None else out, out,
        rows, n, k,
        x2.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None,
        DOT=use_dot,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=16 if use_dot else 1,
        EVEN_N=n % block_n == 0,
        EVEN_K=k % block_k == 0,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out.view(*x.shape[:-1], n)
