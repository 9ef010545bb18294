"""Kernels of the runtime: each op has a Triton kernel and a plain PyTorch reference.

The runtime calls the ops through `kubeinfer.kernels.ops`, which routes to the Triton kernel or the
reference according to the selected backend (`set_backend`): "auto" takes Triton on CUDA tensors and the
reference elsewhere, "torch" always takes the reference, "triton" always takes Triton (on CPU that needs
`TRITON_INTERPRET=1`).

Paged KV cache layout, shared by every attention op: `k_cache` and `v_cache` are
`[num_blocks, block_size, num_kv_heads, head_dim]`; token slot `s` lives at block `s // block_size`,
offset `s % block_size`.
"""
from kubeinfer.kernels.backend import get_backend, set_backend

__all__ = ["get_backend", "set_backend"]   # torch-free: the API process reads BACKENDS
