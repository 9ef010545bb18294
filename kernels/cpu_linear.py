"""Linear layers on the CPU over weights packed once, at load, into oneDNN's blocked layout (bf16 and fp32).

`F.linear` on a bf16 CPU weight hands oneDNN a plain `[out, in]` matrix, which it packs into its AMX / AVX-512-BF16
tile layout on every call. Packing once when the model loads takes that off every step. Measured on the developer
box (one thread, CPU time per call, bf16, 512 input features, 1,536 outputs): 1 token 110 -> 47 us, 64 tokens
203 -> 128 us, 1,024 tokens 1,607 -> 1,487 us (benchmarks/cpu_linear.py).

fp32 packs too: oneDNN's packed sgemm against MKL's on the plain layout, on the 2-vCPU AVX2 box (ad-hoc scripts,
docs/benchmarks.md; 2 threads, the throughput model's shapes): 16 tokens 25-40% faster on every shape; 2,048
tokens 16% faster for the wide gate/up, 8-12% slower for the others; the model's whole prefill about even. Offline
throughput (benchmarks/throughput.py's workload, alternating, median of 3): 8.63 -> 7.61 s, the same greedy tokens
64/64. The packed result equals `F.linear`'s up to rounding (the same products, summed in another order);
tests/kernels/test_cpu_linear.py checks it.
"""
import torch

PACKED_DTYPES = (torch.bfloat16, torch.float32)


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` (a 2-D CPU tensor) can be packed: bf16 or fp32, and a torch with oneDNN's linear (for bf16,
    one whose oneDNN runs bf16 on this CPU)."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (weight.device.type == "cpu" and weight.dtype in PACKED_DTYPES and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")
            and (weight.dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight [out, in]` in oneDNN's layout for `linear` (an opaque tensor: use it only there)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` over `pack(weight)`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
