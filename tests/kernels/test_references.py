"""The PyTorch references themselves, against independent implementations.

- paged attention (decode and extend) vs `scaled_dot_product_attention` on dense, unpaged K/V with an
  explicit causal-offset / sliding-window mask and KV heads repeated for GQA;
- rms_norm vs transformers' LlamaRMSNorm; rotary vs transformers' Llama rotary module and
  apply_rotary_pos_emb (default and llama3 scaling); silu_and_mul vs F.silu(a) * b.
These need no Triton; fp32 on CPU, so the only differences are summation order (atol/rtol 1e-5).
"""
import pytest
import torch
import torch.nn.functional as F

from kubeinfer.kernels import references

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _sdpa_reference(q, dense_k, dense_v, cu_seqlens_q, scale, sliding_window):
    """Per sequence: dense SDPA with an explicit boolean mask (True = attend)."""
    outs = []
    for i, (k, v) in enumerate(zip(dense_k, dense_v)):
        chunk = q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]]                       # [n, H, D]
        n, seq_len, group = chunk.shape[0], k.shape[0], q.shape[1] // k.shape[1]
        query_pos = torch.arange(seq_len - n, seq_len)[:, None]
        key_pos = torch.arange(seq_len)[None, :]
        mask = key_pos <= query_pos
        if sliding_window is not None:
            mask &= key_pos > query_pos - sliding_window
        out = F.scaled_dot_product_attention(
            chunk.transpose(0, 1), k.repeat_interleave(group, dim=1).transpose(0, 1),
            v.repeat_interleave(group, dim=1).transpose(0, 1), attn_mask=mask, scale=scale)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (10, 2)])
@pytest.mark.parametrize("sliding_window", [None, 6])
@pytest.mark.parametrize("block_size", [16, 32])
def test_extend_reference_vs_sdpa(make_paged, num_heads, num_kv_heads, sliding_window, block_size):
    seq_lens, q_lens = [1, 40, 47, 33, 70], [1, 40, 15, 1, 5]
    q, k_cache, v_cache, meta, dense_k, dense_v = make_paged(seq_lens, q_lens, num_heads, num_kv_heads, 64,
                                                             block_size, torch.float32, "cpu", seed=block_size)
    got = references.extend_attention(q, k_cache, v_cache, meta, 0.125, sliding_window)
    want = _sdpa_reference(q, dense_k, dense_v, meta.cu_seqlens_q.tolist(), 0.125, sliding_window)
    torch.testing.assert_close(got, want, **TOL)
    # The router sends a mixed batch to the extend path.
    torch.testing.assert_close(references.paged_attention(q, k_cache, v_cache, meta, 0.125, sliding_window), want,
                               **TOL)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("sliding_window", [None, 3])
def test_short_queries_take_the_batched_path_and_match_sdpa(make_paged, num_heads, num_kv_heads, sliding_window):
    """A speculative step's shape: one to five queries per sequence (a decode token, or one and its drafts)."""
    seq_lens, q_lens = [5, 40, 1, 33, 17], [5, 2, 1, 4, 1]
    q, k_cache, v_cache, meta, dense_k, dense_v = make_paged(seq_lens, q_lens, num_heads, num_kv_heads, 32, 16,
                                                             torch.float32, "cpu", seed=5)
    assert 1 < meta.max_seqlen_q <= references.SHORT_QUERIES and not meta.is_decode_only
    want = _sdpa_reference(q, dense_k, dense_v, meta.cu_seqlens_q.tolist(), 0.2, sliding_window)
    torch.testing.assert_close(references.short_extend_attention(q, k_cache, v_cache, meta, 0.2, sliding_window),
                               want, **TOL)
    torch.testing.assert_close(references.extend_attention(q, k_cache, v_cache, meta, 0.2, sliding_window), want,
                               **TOL)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 1), (10, 2)])
@pytest.mark.parametrize("sliding_window", [None, 1, 20])
def test_decode_reference_vs_sdpa(make_paged, num_heads, num_kv_heads, sliding_window):
    seq_lens = [1, 16, 33, 80]
    q, k_cache, v_cache, meta, dense_k, dense_v = make_paged(seq_lens, [1] * 4, num_heads, num_kv_heads, 80, 16,
                                                             torch.float32, "cpu", seed=2)
    want = _sdpa_reference(q, dense_k, dense_v, meta.cu_seqlens_q.tolist(), 0.1, sliding_window)
    torch.testing.assert_close(references.decode_attention(q, k_cache, v_cache, meta, 0.1, sliding_window), want,
                               **TOL)
    torch.testing.assert_close(references.extend_attention(q, k_cache, v_cache, meta, 0.1, sliding_window), want,
                               **TOL)


def test_store_kv_reference_round_trip(make_paged):
    """Tokens stored through slots are read back at the positions their block tables say."""
    _, k_cache, v_cache, meta, _, _ = make_paged([20, 35], [1, 1], 2, 2, 64, 16, torch.float32, "cpu")
    k_new, v_new = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    # Positions 19 of seq 0 and 34 of seq 1 via their tables; the middle token is padding.
    slots = torch.tensor([int(meta.block_tables[0, 1]) * 16 + 3, -1, int(meta.block_tables[1, 2]) * 16 + 2])
    before = k_cache.clone()
    references.store_kv(k_new, v_new, k_cache, v_cache, slots)
    gathered0 = references._gather_kv(k_cache, meta.block_tables[0], 20)
    gathered1 = references._gather_kv(v_cache, meta.block_tables[1], 35)
    assert torch.equal(gathered0[19], k_new[0]) and torch.equal(gathered1[34], v_new[2])
    assert (k_cache != before).any(dim=-1).sum() == 2 * 2                   # two tokens x two heads changed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_reference_vs_llama(dtype, with_residual):
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    gen = torch.Generator().manual_seed(0)
    norm = modeling_llama.LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen))
    norm = norm.to(dtype)
    x = (3 * torch.randn(5, 96, generator=gen)).to(dtype)
    residual = torch.randn(5, 96, generator=gen).to(dtype) if with_residual else None
    got = references.rms_norm(x, norm.weight.detach(), 1e-5, residual)
    summed = x + residual if with_residual else x
    with torch.no_grad():
        want = norm(summed)
    if with_residual:
        assert torch.equal(got[1], summed)
        got = got[0]
    torch.testing.assert_close(got, want, atol=0, rtol=0)   # same ops in the same order: bitwise


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
], ids=["default", "llama3"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_reference_vs_llama(rope_parameters, head_dim):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama
    num_heads, num_kv_heads, max_positions = 4, 2, 512
    config = transformers.LlamaConfig(hidden_size=num_heads * head_dim, num_attention_heads=num_heads,
                                      num_key_value_heads=num_kv_heads, head_dim=head_dim,
                                      max_position_embeddings=max_positions, rope_parameters=rope_parameters)
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    # Our cache from HF's own cos/sin: [max_positions, head_dim] = cos | sin of the first half.
    all_positions = torch.arange(max_positions)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), all_positions)
    half = head_dim // 2
    assert torch.equal(cos[..., :half], cos[..., half:])                     # HF repeats the frequencies
    cache = torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1)

    gen = torch.Generator().manual_seed(head_dim)
    num_tokens = 9
    positions = torch.randint(0, max_positions, (num_tokens,), generator=gen)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    got_q, got_k = references.rotary_embedding(positions, q, k, cache)

    cos_t, sin_t = rotary(q, positions[None])                               # [1, T, D]
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                         cos_t, sin_t)       # [1, H, T, D]
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), **TOL)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), **TOL)
    if rope_parameters["rope_type"] == "llama3":
        # Scaling changed the low frequencies: the unscaled cache must differ from HF's.
        inv_freq = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
        plain = torch.outer(torch.arange(max_positions).float(), inv_freq)
        assert not torch.allclose(torch.cat((plain.cos(), plain.sin()), -1), cache, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_reference_vs_functional(dtype):
    x = torch.randn(3, 4, 2 * 48, generator=torch.Generator().manual_seed(0)).to(dtype)
    a, b = x[..., :48], x[..., 48:]
    torch.testing.assert_close(references.silu_and_mul(x), F.silu(a) * b, atol=0, rtol=0)
    torch.testing.assert_close(references.silu_and_mul(x).float(), (a.float() * torch.sigmoid(a.float()) * b.float()),
                               atol=1e-6 if dtype == torch.float32 else 2e-2, rtol=1e-5 if dtype == torch.float32 else 2e-2)
