"""bf16 linear layers on the CPU over weights packed once, at load, into oneDNN's blocked layout.

`F.linear` on a bf16 CPU weight hands oneDNN a plain `[out, in]` matrix, which it packs into its AMX / AVX-512-BF16
tile layout on every call. Packing once when the model loads takes that off every step. Measured on the developer
box (one thread, CPU time per call, bf16, 512 input features, 1,536 outputs): 1 token 110 -> 47 us, 64 tokens
203 -> 128 us, 1,024 tokens 1,607 -> 1,487 us (benchmarks/cpu_linear.py). fp32 keeps `F.linear`: MKL's sgemm reads
the plain layout, and there is nothing to pack. The packed result equals `F.linear`'s up to bf16 rounding of the
output (the same products, summed in another order); tests/kernels/test_cpu_linear.py checks it.
"""
import torch

PACKED_DTYPES = (torch.bfloat16,)


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` (a 2-D CPU tensor) can be packed: bf16, and a torch whose oneDNN runs bf16 on this CPU."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (weight.device.type == "cpu" and weight.dtype in PACKED_DTYPES and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise") and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight [out, in]` in oneDNN's layout for `linear` (an opaque tensor: use it only there)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` over `pack(weight)`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
