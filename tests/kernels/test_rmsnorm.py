"""RMSNorm kernel (plain and with fused residual add) vs its reference."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.rmsnorm import rms_norm  # noqa: E402


@pytest.mark.parametrize("shape", [(7, 64), (3, 80), (2, 3, 4096), (1, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(device, dtype, tol, shape, with_residual):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (3 * torch.randn(shape, generator=gen)).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(device, dtype)
    residual = torch.randn(shape, generator=gen).to(device, dtype) if with_residual else None
    x_before = x.clone()

    got = rms_norm(x, weight, 1e-6, residual)
    want = references.rms_norm(x, weight, 1e-6, residual)

    assert torch.equal(x, x_before), "the input must not be modified"
    if with_residual:
        torch.testing.assert_close(got[1], want[1], **tol(dtype, "exact"))   # x + residual, one rounding
        got, want = got[0], want[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **tol(dtype, "elementwise"))


def test_rms_norm_strided_rows(device, dtype, tol):
    """Rows of a wider buffer (unit stride inside a row only)."""
    gen = torch.Generator().manual_seed(1)
    buf = torch.randn(6, 160, generator=gen).to(device, dtype)
    x = buf[:, :80]
    weight = torch.randn(80, generator=gen).to(device, dtype)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), references.rms_norm(x, weight, 1e-5),
                               **tol(dtype, "elementwise"))
