"""Rotary embedding kernel vs its reference (NeoX/Llama layout, precomputed cos/sin cache)."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.rotary import rotary_embedding  # noqa: E402


def _cos_sin_cache(head_dim: int, max_positions: int, theta: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 4, 64), (10, 2, 80), (8, 1, 128)])
def test_rotary_matches_reference(device, dtype, tol, num_heads, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    num_tokens, max_positions = 13, 4096
    positions = torch.randint(0, max_positions, (num_tokens,), generator=gen)
    positions[0] = 0
    cache = _cos_sin_cache(head_dim, max_positions).to(device)
    # q and k as views of a fused QKV output.
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=gen).to(device, dtype)
    q, k = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads]
    qkv_before = qkv.clone()

    q_got, k_got = rotary_embedding(positions.to(device), q, k, cache)
    q_want, k_want = references.rotary_embedding(positions.to(device), q, k, cache)

    assert torch.equal(qkv, qkv_before), "the inputs must not be modified"
    torch.testing.assert_close(q_got, q_want, **tol(dtype, "elementwise"))
    torch.testing.assert_close(k_got, k_want, **tol(dtype, "elementwise"))
    # Position 0 is the identity.
    torch.testing.assert_close(q_got[0], q[0], **tol(dtype, "elementwise"))


def test_rotary_int32_positions(device, dtype, tol):
    gen = torch.Generator().manual_seed(3)
    cache = _cos_sin_cache(64, 100).to(device)
    q = torch.randn(5, 2, 64, generator=gen).to(device, dtype)
    k = torch.randn(5, 1, 64, generator=gen).to(device, dtype)
    positions = torch.tensor([99, 1, 50, 7, 0], device=device)
    got = rotary_embedding(positions.int(), q, k, cache)
    want = references.rotary_embedding(positions, q, k, cache)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol(dtype, "elementwise"))
