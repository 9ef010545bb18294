"""Which implementation the ops use: Triton kernels or their PyTorch references."""
import os

BACKENDS = ("auto", "torch", "triton")
_backend = os.environ.get("KUBEINFER_KERNEL_BACKEND", "auto")


def set_backend(name: str) -> None:
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose one of {', '.join(BACKENDS)}")
    _backend = name


def get_backend() -> str:
    return _backend


def use_triton(tensor) -> bool:
    """Policy: "auto" runs Triton only on CUDA tensors; the reference is the CPU path."""
    if _backend == "auto":
        return tensor.is_cuda
    return _backend == "triton"
