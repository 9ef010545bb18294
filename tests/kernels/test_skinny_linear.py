"""The decode-size linear kernel (kernels/skinny_linear.py) vs torch's F.linear, and where the ops route to it."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from kubeinfer.kernels import ops, skinny_linear as skinny  # noqa: E402

# (rows, out features, in features, bias, config or None for the default): uneven N and K, both paths at one row
CASES = [
    (1, 100, 300, True, None),
    (1, 96, 512, False, (32, 128, 4, 2, True)),
    (3, 64, 256, False, None),
    (16, 40, 520, True, None),
    (7, 128, 1024, True, (64, 64, 4, 3, True)),
]


def _operands(rows, n, k, bias, device, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * k ** -0.5
    b = torch.randn(n, generator=gen) if bias else None
    return x.to(device, dtype), w.to(device, dtype), None if b is None else b.to(device, dtype)


@pytest.mark.parametrize("rows,n,k,bias,config", CASES)
def test_skinny_linear_matches_f_linear(device, dtype, tol, rows, n, k, bias, config):
    x, w, b = _operands(rows, n, k, bias, device, dtype)
    got = skinny.skinny_linear(x, w, b, config)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype)
    assert got.shape == (rows, n) and got.dtype == dtype
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_both_paths_at_one_row_agree_and_keep_leading_dims(device, dtype, tol):
    x, w, b = _operands(1, 80, 384, True, device, dtype, seed=1)
    fma = skinny.skinny_linear(x.view(1, 1, -1), w, b, (16, 128, 4, 2, False))
    dot = skinny.skinny_linear(x.view(1, 1, -1), w, b, (16, 128, 4, 2, True))
    assert fma.shape == dot.shape == (1, 1, 80)
    torch.testing.assert_close(fma, dot, **tol(dtype, "attention"))


def test_bad_calls_are_refused():
    x, w, _ = _operands(skinny.MAX_ROWS + 1, 16, 32, False, "cpu", torch.float32)
    with pytest.raises(AssertionError, match="at most"):
        skinny.skinny_linear(x, w)
    with pytest.raises(ValueError, match="one row"):
        skinny.skinny_linear(x[:2], w, config=(16, 32, 4, 2, False))
    with pytest.raises(AssertionError, match="in-features"):
        skinny.skinny_linear(x[:1, :16], w)


def test_the_cpu_path_stays_torch():
    x, w, _ = _operands(1, 16, 32, False, "cpu", torch.bfloat16)
    assert not skinny.applies(x, w)
    torch.testing.assert_close(ops.linear(x, w), F.linear(x, w), atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 2, 16, 17])
def test_ops_linear_on_cuda_takes_the_kernel_up_to_max_rows(rows, monkeypatch):
    x, w, b = _operands(rows, 4096, 1024, True, "cuda", torch.bfloat16, seed=rows)
    calls = []
    real = skinny.skinny_linear
    monkeypatch.setattr(skinny, "skinny_linear", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = ops.linear(x, w, b)
    assert len(calls) == (rows <= skinny.MAX_ROWS)
    torch.testing.assert_close(got, F.linear(x.float(), w.float(), b.float()).bfloat16(), atol=2e-2, rtol=2e-2)
