"""Linear layers on the CPU over weights packed once, at load, into oneDNN's blocked layout (bf16 and fp32).

`F.linear` on a bf16 CPU weight hands oneDNN a plain `[out, in]` matrix, which it packs into its AMX / AVX-512-BF16
tile layout on every call. Packing once when the model loads takes that off every step. Measured on the developer
box (one thread, CPU time per call, bf16, 512 input features, 1,536 outputs): 1 token 110 -> 47 us, 64 tokens
203 -> 128 us, 1,024 tokens 1,607 -> 1,487 us (benchmarks/cpu_linear.py).

fp32 packs too: oneDNN's packed sgemm against MKL's on the plain layout, on the 2-vCPU AVX2 box (ad-hoc scripts,
docs/benchmarks/cpu-runtime.md; 2 threads, the throughput model's shapes): 16 tokens 25-40% faster on every shape; 2,048
tokens 16% faster for the wide gate/up, 8-12% slower for the others; the model's whole prefill about even. Offline
throughput (benchmarks/throughput.py's workload, alternating, median of 3): 8.63 -> 7.61 s, the same greedy tokens
64/64. The packed result equals `F.linear`'s up to rounding (the same products, summed in another order);
tests/kernels/test_cpu_linear.py checks it.

On a CPU with AVX2 and FMA, fp32 weights take panels of 16 outputs instead (32 with AVX-512; `Panels`,
csrc/linear_cpu.c): a decode step's few rows read each weight once, in order, near the streaming rate, where oneDNN's
sgemm read them at about half of it on the AVX2 box (docs/benchmarks/cpu-runtime.md); on the AVX-512 box 10-50%
faster than oneDNN at 1-16 rows, even at 64, 5-20% slower at 512, the offline run 2% faster (5% with its prefixes
cached). bf16 weights take panels where oneDNN has no bf16 GEMM (AVX2 without AVX512-BF16: read at half the bytes
of fp32), and stay oneDNN's where it has one (AVX512-BF16 or AMX: twice the panels' rate from 16 rows up).
`KUBEINFER_CPU_LINEAR=onednn` keeps oneDNN everywhere (to compare).
"""
import ctypes
import os
from dataclasses import dataclass

import torch

from kubeinfer.kernels import cpu_native

PACKED_DTYPES = (torch.bfloat16, torch.float32)
PANEL = 16   # output rows per panel where the kernel does not say (csrc/linear_cpu.c: 32 with AVX-512)
CHOICE_ENV = "KUBEINFER_CPU_LINEAR"   # "auto" (the default) or "onednn"
_kernel: list = []   # [the PanelKernel, or None where it does not run here], once looked up


@dataclass(frozen=True)
class Panels:
    """A weight `[out, in]` (fp32 or bf16) as ceil(out / W) panels of `[in][W]` (the last padded with zero rows),
    W the kernel's panel width."""
    data: torch.Tensor
    out_features: int
    in_features: int


@dataclass(frozen=True)
class PanelKernel:
    function: object   # kubeinfer_linear, its arguments declared
    width: int         # outputs per panel


def panel_function(lib: ctypes.CDLL | None) -> PanelKernel | None:
    """The kernel of a loaded `linear_cpu` library, its arguments declared; None where it does not run."""
    if lib is None or not lib.kubeinfer_linear_supported():
        return None
    function = lib.kubeinfer_linear
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [p, i64, i64, i64, p, i64, p, p, i64, ctypes.c_int32]
    function.restype = ctypes.c_int
    width = lib.kubeinfer_linear_panel() if hasattr(lib, "kubeinfer_linear_panel") else PANEL   # older sources: 16
    return PanelKernel(function, width)


def _panel_kernel() -> PanelKernel | None:
    """The panel kernel, where it runs and KUBEINFER_CPU_LINEAR is not "onednn"."""
    if not _kernel:
        choice = os.environ.get(CHOICE_ENV, "auto")
        _kernel.append(panel_function(cpu_native.library("linear_cpu")) if choice != "onednn" else None)
    return _kernel[0]


def layout() -> str:
    """How `pack` lays out fp32 weights on this machine: "panels" (our kernel) or "onednn"."""
    return "panels" if _panel_kernel() is not None else "onednn"


def panel_width() -> int:
    """Outputs per panel of this machine's kernel (16, or 32 with AVX-512)."""
    kernel = _panel_kernel()
    return PANEL if kernel is None else kernel.width


def layout_key() -> str:
    """What packed weights' bytes depend on (the weight cache's key): the layout, and a panel's width."""
    return f"panels{panel_width()}" if layout() == "panels" else layout()


def to_panels(weight: torch.Tensor, width: int | None = None) -> Panels:
    """`weight [out, in]` (a 2-D fp32 or bf16 CPU tensor) laid out in panels of `width` outputs (this machine's
    kernel's by default), a new tensor beside it."""
    if weight.dtype not in PACKED_DTYPES:   # the kernel reads every other dtype as fp32
        raise TypeError(f"panels hold fp32 or bf16 weights, not {weight.dtype}")
    width = width or panel_width()
    out_features, in_features = weight.shape
    padded = -(-out_features // width) * width
    rows = weight if padded == out_features else torch.cat([weight, weight.new_zeros(padded - out_features,
                                                                                         in_features)])
    data = rows.reshape(padded // width, width, in_features).transpose(1, 2).contiguous()
    return Panels(data, out_features, in_features)


def panel_linear(x: torch.Tensor, panels: Panels, bias: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` over `to_panels(weight)` (CPU tensors; x of the weight's dtype); into `out`
    (contiguous, `[rows, out_features]`, x's dtype) where given."""
    if x.dtype != panels.data.dtype or not x.is_cpu:
        raise TypeError(f"a {panels.data.dtype} CPU linear got a {x.dtype} input on {x.device}")
    kernel = _panel_kernel()
    if panels.data.shape[-1] != kernel.width:
        raise ValueError(f"panels {panels.data.shape[-1]} wide, but this CPU's kernel takes {kernel.width}")
    rows = x.reshape(-1, panels.in_features)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if out is None:
        out = rows.new_empty(rows.shape[0], panels.out_features)
    elif out.shape != (rows.shape[0], panels.out_features) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"a linear of {rows.shape[0]} rows to {panels.out_features} {x.dtype} outputs cannot "
                         f"write a {out.dtype} tensor of shape {tuple(out.shape)}")
    if bias is not None:
        bias = bias.float().contiguous()   # the kernel adds the bias in fp32, before a bf16 output's one rounding
    if rows.shape[0] and kernel.function(
            rows.data_ptr(), rows.stride(0), rows.shape[0], panels.in_features, panels.data.data_ptr(),
            panels.out_features, None if bias is None else bias.data_ptr(), out.data_ptr(), panels.out_features,
            rows.dtype == torch.bfloat16):
        raise MemoryError(f"no scratch memory for a bf16 linear of {rows.shape[0]} rows")
    return out.view(*x.shape[:-1], panels.out_features)


def onednn_packs(weight: torch.Tensor) -> bool:
    """Whether torch's oneDNN linear takes `weight` (a 2-D CPU tensor) packed: bf16 or fp32, and for bf16 a oneDNN
    that runs bf16 on this CPU."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (weight.device.type == "cpu" and weight.dtype in PACKED_DTYPES and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")
            and (weight.dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` (a 2-D CPU tensor) can be packed: bf16 or fp32, and either the panel kernel runs here or
    oneDNN packs it."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES or weight.dim() != 2:
        return False
    return _panel_kernel() is not None or onednn_packs(weight)


def takes_panels(weight: torch.Tensor) -> bool:
    """Whether `pack` lays `weight` out in panels: where their kernel runs, for fp32, and for bf16 where oneDNN has
    no bf16 GEMM (with one, AVX512-BF16 or AMX, it runs twice the panels' rate from 16 rows up)."""
    return _panel_kernel() is not None and (weight.dtype == torch.float32 or (
        weight.dtype == torch.bfloat16 and not onednn_packs(weight)))


def pack(weight: torch.Tensor) -> torch.Tensor | Panels:
    """`weight [out, in]` laid out for `linear`: in panels where `takes_panels`, else in oneDNN's layout (an opaque
    tensor: use it only there)."""
    return to_panels(weight) if takes_panels(weight) else onednn_pack(weight)


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight [out, in]` in oneDNN's packed layout: an opaque tensor, with no bytes of its own to read."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def onednn_unpack(packed: torch.Tensor) -> torch.Tensor:
    """The plain `[out, in]` weight an `onednn_pack`ed one was made from (a new tensor, its exact bytes): what the
    weight cache and a sleeping engine keep of it, to pack again."""
    return packed.to_dense()


def linear(x: torch.Tensor, packed: torch.Tensor | Panels, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` over `pack(weight)`."""
    if isinstance(packed, Panels):
        return panel_linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
