"""The native CPU RMSNorm, rotary embedding, SiLU-and-mul, K/V store and argmax (kernels/csrc/elementwise_cpu.c)
against the PyTorch references: odd sizes, strided views as the model passes them, one row and thousands, extreme
activations; and `ops` routing to them on the CPU while the "torch" backend still takes the references."""
import pytest
import torch

from kubeinfer.kernels import cpu_elementwise, cpu_native, get_backend, ops, references, set_backend

if cpu_native.library("elementwise_cpu") is None:
    pytest.skip("no C compiler here: the native CPU kernels are not built (the references run instead)",
                allow_module_level=True)

TOL = dict(atol=1e-5, rtol=1e-5)
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def randn(*shape, seed=0, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def assert_matches(got, want):
    """fp32: within summation-order error. bf16: the kernel rounds where the reference does, so elements are equal
    to the bit but where a sum or an exp of another order moved a value across a rounding edge (rarely; a step
    there can compound with the next rounding)."""
    if want.dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, atol=0, rtol=2 ** -6)   # within two bf16 steps
        assert (got == want).float().mean() > 0.99, "bf16 results should mostly be bit-equal to the reference's"
    else:
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("rows,cols", [(1, 64), (3, 96), (2048, 512), (17, 4096), (5, 7)])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(rows, cols, with_residual, dtype):
    x, weight = randn(rows, cols, seed=rows, dtype=dtype), randn(cols, seed=cols, dtype=dtype)
    residual = randn(rows, cols, seed=rows + 1, scale=3.0, dtype=dtype) if with_residual else None
    got = cpu_elementwise.rms_norm(x, weight, 1e-6, residual)
    want = references.rms_norm(x, weight, 1e-6, residual)
    if with_residual:
        assert_matches(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)   # x + residual: one rounding, as torch's
    else:
        assert_matches(got, want)


def test_rms_norm_of_head_views_as_qwen3_norms_q_and_k():
    """q split out of a fused QKV output, viewed [tokens, heads, D]: rows two strides apart, normed per head."""
    qkv = randn(37, 8 * 64 + 2 * 2 * 64, seed=3)
    q = qkv[:, :8 * 64].view(37, 8, 64)
    weight = randn(64, seed=4)
    torch.testing.assert_close(cpu_elementwise.rms_norm(q, weight, 1e-6), references.rms_norm(q, weight, 1e-6), **TOL)
    assert qkv.equal(randn(37, 8 * 64 + 2 * 2 * 64, seed=3)), "the input was written"


@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(1, 8, 2, 64), (300, 8, 4, 64), (33, 32, 8, 128),
                                                            (5, 3, 1, 80), (2048, 8, 4, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_reference_on_qkv_views(tokens, heads, kv_heads, head_dim, dtype):
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = randn(tokens, q_size + 2 * kv_size, seed=tokens, dtype=dtype)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    cos_sin = randn(4096, head_dim, seed=head_dim)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(1))
    got_q, got_k = cpu_elementwise.rotary_embedding(positions, q, k, cos_sin)
    want_q, want_k = references.rotary_embedding(positions, q, k, cos_sin)
    assert_matches(got_q, want_q)
    assert_matches(got_k, want_k)


@pytest.mark.parametrize("shape", [(1, 2 * 1365), (2048, 2 * 1365), (3, 5, 2 * 48), (4, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(shape, dtype):
    x = randn(*shape, seed=shape[0], scale=4.0, dtype=dtype)
    assert_matches(cpu_elementwise.silu_and_mul(x), references.silu_and_mul(x))


def test_silu_and_mul_of_extreme_gates_stays_finite():
    """The library is built with -ffast-math (no infinities assumed): a gate of -1e4 must give ~0, not NaN."""
    gate = torch.tensor([[-1e4, -100.0, -88.0, 0.0, 88.0, 1e4]])
    x = torch.cat([gate, torch.full_like(gate, 2.0)], dim=-1)
    got = cpu_elementwise.silu_and_mul(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, references.silu_and_mul(x), **TOL)


def test_unsupported_inputs_are_declined_not_wrong():
    """Other dtypes and layouts return None, so that ops take the reference."""
    assert cpu_elementwise.silu_and_mul(randn(4, 6).to(torch.float16)) is None
    assert cpu_elementwise.rms_norm(randn(4, 6), randn(6, dtype=torch.bfloat16), 1e-6) is None   # mixed dtypes
    assert cpu_elementwise.rms_norm(randn(4, 6).t(), randn(4), 1e-6) is None   # last dimension not contiguous
    q = randn(3, 2, 6)
    assert cpu_elementwise.rotary_embedding(torch.arange(3), q, q[:, :, :4], randn(8, 6)) is None


@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 7), (2, 8), (5, 9), (4, 17), (64, 1000), (2, 151936)])
def test_argmax_is_torchs_index_with_ties_infinities_and_nans(rows, vocab):
    """Logits rounded to quarters (many ties, the first index must win), then rows as a step may hold them: all -inf
    (a grammar that allows nothing), the maximum at the end, NaNs (torch takes the first NaN as the largest)."""
    x = torch.round(randn(rows + 4, vocab, seed=rows) * 4) / 4
    x[-4] = float("-inf")
    x[-3, -1] = x[-3].max() + 1
    x[-2, vocab // 2] = float("nan")
    x[-1, :] = x[-1, 0]   # all equal: index 0
    x[-1, -1] = float("nan")
    assert torch.equal(cpu_elementwise.argmax(x), x.argmax(dim=-1))
    view = x[:, : max(1, vocab - 3)]   # rows further apart than their length
    assert torch.equal(cpu_elementwise.argmax(view), view.argmax(dim=-1))


def test_argmax_declines_what_it_does_not_read():
    assert cpu_elementwise.argmax(randn(4, 6).to(torch.bfloat16)) is None
    assert cpu_elementwise.argmax(randn(6)) is None
    assert cpu_elementwise.argmax(randn(4, 6).t()) is None
    assert cpu_elementwise.argmax(randn(0, 6)) is None


@pytest.mark.parametrize("tokens,kv_heads,head_dim", [(1, 3, 64), (7, 2, 16), (700, 4, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_matches_reference_on_qkv_views_with_padding(tokens, kv_heads, head_dim, dtype):
    """K and V as the attention layer passes them (views of one fused QKV row per token), slots scattered over the
    blocks, some tokens padding (slot -1): the caches after equal the reference's to the bit, untouched slots
    included."""
    q_heads, blocks, block_size = 2 * kv_heads, 64, 16
    qkv = randn(tokens, (q_heads + 2 * kv_heads) * head_dim, seed=tokens, dtype=dtype)
    k = qkv[:, q_heads * head_dim:(q_heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (q_heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(blocks * block_size, generator=torch.Generator().manual_seed(tokens))[:tokens]
    slots[::5] = -1
    caches = [randn(blocks, block_size, kv_heads, head_dim, seed=s, dtype=dtype) for s in (1, 2)]
    want = [c.clone() for c in caches]
    references.store_kv(k, v, *want, slots)
    assert cpu_elementwise.store_kv(k, v, *caches, slots)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1])


def test_store_kv_declines_what_it_does_not_copy():
    """A cache of another dtype (fp8, or fp32 under a bf16 model: the reference converts) or a layout it does not
    address is declined, and nothing is written."""
    k = randn(4, 2, 8)
    cache = torch.zeros(8, 4, 2, 8)
    slots = torch.arange(4)
    assert not cpu_elementwise.store_kv(k.to(torch.bfloat16), k.to(torch.bfloat16), cache, cache.clone(), slots)
    assert not cpu_elementwise.store_kv(k, k, cache.to(torch.float8_e4m3fn), cache.to(torch.float8_e4m3fn), slots)
    assert not cpu_elementwise.store_kv(k.transpose(1, 2).contiguous().transpose(1, 2), k, cache, cache.clone(), slots)
    assert not cache.any()


@pytest.fixture
def backend():
    before = get_backend()
    yield set_backend
    set_backend(before)


def test_ops_route_to_the_native_kernels_on_cpu_and_to_the_references_under_torch(backend, monkeypatch):
    x, weight = randn(6, 32, seed=5), randn(32, seed=6)
    calls = []
    native = cpu_elementwise.silu_and_mul
    monkeypatch.setattr(cpu_elementwise, "silu_and_mul", lambda t: calls.append(t) or native(t))
    backend("cpu")
    torch.testing.assert_close(ops.silu_and_mul(x), references.silu_and_mul(x), **TOL)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), references.rms_norm(x, weight, 1e-5), **TOL)
    assert len(calls) == 1
    assert torch.equal(ops.argmax(x), x.argmax(dim=-1))
    monkeypatch.setattr(cpu_elementwise, "argmax", lambda t: calls.append(t) or None)
    assert torch.equal(ops.argmax(x), x.argmax(dim=-1))   # declined: torch's
    assert len(calls) == 2
    backend("torch")
    ops.silu_and_mul(x)
    ops.argmax(x)
    assert len(calls) == 2, "the torch backend (the tests' oracle) must not run the native kernels"
