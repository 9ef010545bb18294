"""Paged decode attention kernel (split-K, GQA) vs the reference."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.decode_attention import decode_attention  # noqa: E402
from support.kernel_cases import attention_cases  # noqa: E402

# One token, block edges of 16 and 32 (16, 33, 64), past BLOCK_N=64 (80), and odd lengths.
SEQ_LENS = [1, 16, 33, 80, 47]


# The default run keeps each layout at head size 64 and block 16, each head size and block 32 at least once (as
# test_extend_attention.py does): 8 of the 24 cases; -m slow runs all.
CASES = attention_cases({(16, 64, "mha"), (16, 64, "gqa4"), (16, 64, "gqa8"), (16, 64, "gqa5"), (16, 80, "gqa5"),
                         (16, 128, "mha"), (32, 80, "gqa4"), (32, 128, "gqa8")})


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", CASES)
def test_decode_matches_reference(device, dtype, tol, make_paged, num_heads, num_kv_heads, head_dim, block_size):
    q, k_cache, v_cache, meta, _, _ = make_paged(SEQ_LENS, [1] * len(SEQ_LENS), num_heads, num_kv_heads,
                                                 head_dim, block_size, dtype, device, seed=head_dim + block_size)
    scale = head_dim ** -0.5
    got = decode_attention(q, k_cache, v_cache, meta, scale)
    want = references.decode_attention(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


@pytest.mark.parametrize("num_kv_splits", [1, 2, 5])
@pytest.mark.parametrize("sliding_window", [None, 1, 20])
def test_decode_splits_and_window(device, dtype, tol, make_paged, num_kv_splits, sliding_window):
    """Forced split counts (incl. splits left empty for short sequences) and sliding windows."""
    q, k_cache, v_cache, meta, _, _ = make_paged([1, 80, 21, 130], [1] * 4, 8, 2, 64, 16, dtype, device, seed=7)
    got = decode_attention(q, k_cache, v_cache, meta, 0.125, sliding_window, num_kv_splits=num_kv_splits)
    want = references.decode_attention(q, k_cache, v_cache, meta, 0.125, sliding_window)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_decode_noncontiguous_query(device, dtype, tol, make_paged):
    """q as a view of a fused QKV output (token stride != heads * head_dim)."""
    _, k_cache, v_cache, meta, _, _ = make_paged([5, 40], [1, 1], 4, 2, 64, 16, dtype, device, seed=3)
    qkv = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    q = qkv[:, :4]
    got = decode_attention(q, k_cache, v_cache, meta, 0.125)
    want = references.decode_attention(q.contiguous(), k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_decode_padding_row_yields_zeros(device, dtype, tol, make_paged):
    """A seq_len-0 row (CUDA-graph padding) gives zeros, not NaN, and leaves the other rows right."""
    q, k_cache, v_cache, meta, _, _ = make_paged([30, 1], [1, 1], 4, 2, 64, 16, dtype, device, seed=9)
    meta.seq_lens[1] = 0
    got = decode_attention(q, k_cache, v_cache, meta, 0.125, num_kv_splits=2)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    meta.seq_lens, meta.block_tables = meta.seq_lens[:1], meta.block_tables[:1]
    torch.testing.assert_close(got[:1], references.decode_attention(q[:1], k_cache, v_cache, meta, 0.125),
                               **tol(dtype, "attention"))
