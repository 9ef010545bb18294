"""Paged prefill/extend attention kernel (causal offset, sliding window, GQA) vs the reference."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.extend_attention import extend_attention  # noqa: E402
from support.kernel_cases import attention_cases  # noqa: E402

# (seq_len, query chunk) pairs: a one-token prompt, a full prefill past BLOCK_M=64 and block edges,
# a prefix-cache hit (chunk after 32 cached tokens), a decode row, a chunked-prefill middle piece, and a
# long chunk after 60 cached tokens whose later query tiles have whole key tiles before them (unmasked).
MIXED = [(1, 1), (80, 80), (47, 15), (33, 1), (70, 5), (200, 140)]


# Head layouts with the extend kernel's own head counts (5 heads of one KV head for an odd group).
HEADS = {"mha": (2, 2), "gqa4": (4, 1), "gqa8": (8, 1), "gqa5": (5, 1)}
# The default run keeps each layout at head size 64 (fills the tile), each head size with at least one layout (80:
# masked along the head; 128: two tiles' worth), and block 32 (the block size changes the paging, which does not
# depend on the head size) once: 8 of the 24 cases; -m slow runs all.
CASES = attention_cases({(16, 64, "mha"), (16, 64, "gqa4"), (16, 64, "gqa8"), (16, 64, "gqa5"), (16, 80, "gqa5"),
                         (16, 80, "gqa8"), (16, 128, "mha"), (32, 80, "gqa4")}, HEADS)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", CASES)
def test_extend_matches_reference(device, dtype, tol, make_paged, num_heads, num_kv_heads, head_dim, block_size):
    seq_lens, q_lens = zip(*MIXED)
    q, k_cache, v_cache, meta, _, _ = make_paged(list(seq_lens), list(q_lens), num_heads, num_kv_heads, head_dim,
                                                 block_size, dtype, device, seed=head_dim + block_size)
    scale = head_dim ** -0.5
    got = extend_attention(q, k_cache, v_cache, meta, scale)
    want = references.extend_attention(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


@pytest.mark.parametrize("sliding_window", [1, 7, 20, 64])
def test_extend_sliding_window(device, dtype, tol, make_paged, sliding_window):
    """Windows narrower than a tile, than a block, and as wide as a tile."""
    seq_lens, q_lens = zip(*MIXED)
    q, k_cache, v_cache, meta, _, _ = make_paged(list(seq_lens), list(q_lens), 8, 2, 64, 16, dtype, device, seed=11)
    got = extend_attention(q, k_cache, v_cache, meta, 0.125, sliding_window)
    want = references.extend_attention(q, k_cache, v_cache, meta, 0.125, sliding_window)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_extend_decode_only_batch_agrees_with_decode_kernel(device, dtype, tol, make_paged):
    """A batch of single-token chunks: the extend kernel and the decode kernel give the same answer."""
    from kubeinfer.kernels.decode_attention import decode_attention
    q, k_cache, v_cache, meta, _, _ = make_paged([3, 50, 17], [1, 1, 1], 8, 2, 80, 16, dtype, device, seed=5)
    got = extend_attention(q, k_cache, v_cache, meta, 0.1)
    torch.testing.assert_close(got, decode_attention(q, k_cache, v_cache, meta, 0.1), **tol(dtype, "attention"))
    torch.testing.assert_close(got, references.decode_attention(q, k_cache, v_cache, meta, 0.1),
                               **tol(dtype, "attention"))


# (BLOCK_M, BLOCK_N, warps, stages, k_rows_first, mask_d, pack_gqa): K's tiles loaded as stored then transposed, loads
# masked along head_dim where it fills BLOCK_D anyway (the kernel's code before 2026-11-26, night), and a KV group's
# heads packed into one program's rows (4 heads of 1 KV head here: 16 or 8 queries a tile), beside the default.
VARIANTS = [(64, 32, 4, 1, True), (64, 32, 4, 1, False, True), (64, 32, 4, 1, True, True),
            (64, 32, 4, 1, True, False, True), (32, 16, 4, 1, False, False, True)]


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("head_dim", [64, 80])
def test_extend_launch_variants_match_reference(device, dtype, tol, make_paged, config, head_dim):
    """Head size 64 fills BLOCK_D (no mask along it by default), 80 does not (masked whatever the config says)."""
    seq_lens, q_lens = zip(*MIXED)
    q, k_cache, v_cache, meta, _, _ = make_paged(list(seq_lens), list(q_lens), 4, 1, head_dim, 16, dtype, device,
                                                 seed=head_dim)
    got = extend_attention(q, k_cache, v_cache, meta, head_dim ** -0.5, config=config)
    want = references.extend_attention(q, k_cache, v_cache, meta, head_dim ** -0.5)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_packed_kv_groups_keep_sliding_windows_exact(device, dtype, tol, make_paged):
    """A KV group's heads in one program's rows: each row's window starts at its own query's position."""
    seq_lens, q_lens = zip(*MIXED)
    q, k_cache, v_cache, meta, _, _ = make_paged(list(seq_lens), list(q_lens), 8, 2, 64, 16, dtype, device, seed=12)
    for window in (1, 7, 20):
        got = extend_attention(q, k_cache, v_cache, meta, 0.125, window, config=(32, 16, 4, 1, False, False, True))
        want = references.extend_attention(q, k_cache, v_cache, meta, 0.125, window)
        torch.testing.assert_close(got, want, **tol(dtype, "attention"))
