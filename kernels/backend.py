"""Which implementation the ops use: Triton kernels, native CPU kernels, or their PyTorch references.

- "auto": Triton on CUDA tensors; on the CPU the native kernels where they apply (`cpu_native`), else the
  references.
- "torch": always the references (the oracle the tests compare against).
- "triton": always Triton (on CPU that needs `TRITON_INTERPRET=1`).
- "cpu": the native CPU kernels where they apply, else the references (as "auto" on the CPU).
"""
import os

BACKENDS = ("auto", "torch", "triton", "cpu")
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


def use_cpu_native(tensor) -> bool:
    """Policy: "auto" and "cpu" run the native CPU kernels on CPU tensors (where a kernel supports them)."""
    return _backend in ("auto", "cpu") and tensor.is_cpu   # `is_cpu`: no device object built (it runs per op)
