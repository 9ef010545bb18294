"""Shared setup of the kernel tests.

- Without CUDA, Triton runs its kernels in the interpreter: TRITON_INTERPRET=1 is set here, at import
  time, before any test module imports triton.
- Tests that take `device` and `dtype` arguments run on the default device in fp32 (CPU interpreter, or
  CUDA when present) and, behind `-m gpu`, on CUDA in bf16 and fp16.
- `tol(dtype, kind)` gives the stated tolerances; `make_paged` builds a random paged batch.
"""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEFAULT_DEVICE = "cuda" if HAS_CUDA else "cpu"
_needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
DEVICE_DTYPES = [
    pytest.param(DEFAULT_DEVICE, torch.float32, id="fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=[pytest.mark.gpu, _needs_cuda]),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=[pytest.mark.gpu, _needs_cuda]),
]

# (atol, rtol) per dtype and kind of op. fp32 differs from the reference only by summation order;
# bf16/fp16 by one rounding of the output (elementwise) or of the probabilities before P@V (attention).
TOLERANCES = {
    torch.float32: {"exact": (0.0, 0.0), "elementwise": (1e-5, 1e-5), "attention": (1e-5, 1e-5)},
    torch.float16: {"exact": (0.0, 0.0), "elementwise": (2e-3, 2e-3), "attention": (4e-3, 4e-3)},
    torch.bfloat16: {"exact": (0.0, 0.0), "elementwise": (1.6e-2, 1.6e-2), "attention": (2e-2, 2e-2)},
}


def pytest_generate_tests(metafunc):
    if {"device", "dtype"} <= set(metafunc.fixturenames):
        metafunc.parametrize(("device", "dtype"), DEVICE_DTYPES)


@pytest.fixture
def tol():
    def tolerance(dtype: torch.dtype, kind: str) -> dict:
        atol, rtol = TOLERANCES[dtype][kind]
        return {"atol": atol, "rtol": rtol}
    return tolerance


@pytest.fixture
def make_paged():
    """A function building a random paged batch: `(q, k_cache, v_cache, meta, dense_k, dense_v)`.

    Each sequence's blocks are drawn from a shuffled pool (non-contiguous, never block 0 so that the
    table's zero padding points at a block no sequence owns); `dense_k/v` hold every sequence's K/V
    unpaged (`[seq_len, KVH, D]` each) for independent references.
    """
    from kubeinfer.kernels.metadata import AttentionMetadata

    def build(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed=0):
        gen = torch.Generator().manual_seed(seed)
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + 3
        pool = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
        k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
        v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
        dense_k, dense_v = [], []
        for i, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
            tables[i, :nb] = torch.tensor([pool.pop() for _ in range(nb)], dtype=torch.int32)
            rows = tables[i, :nb].long()
            dense_k.append(k_cache[rows].flatten(0, 1)[:n].to(dtype))
            dense_v.append(v_cache[rows].flatten(0, 1)[:n].to(dtype))
        q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        meta = AttentionMetadata(
            cu_seqlens_q=cu.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=tables.to(device), max_seqlen_q=max(q_lens), max_seqlen_k=max(seq_lens),
            slot_mapping=torch.full((sum(q_lens),), -1, dtype=torch.int64, device=device))
        to = dict(dtype=dtype, device=device)
        return (q.to(**to), k_cache.to(**to), v_cache.to(**to), meta,
                [t.to(device) for t in dense_k], [t.to(device) for t in dense_v])

    return build
