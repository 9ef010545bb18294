"""SiLU-and-mul kernel vs its reference."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.activation import silu_and_mul  # noqa: E402


@pytest.mark.parametrize("shape", [(5, 128), (3, 160), (2, 3, 2000), (1, 2)])
def test_silu_and_mul_matches_reference(device, dtype, tol, shape):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (4 * torch.randn(shape, generator=gen)).to(device, dtype)
    got = silu_and_mul(x)
    want = references.silu_and_mul(x)
    assert got.shape == (*shape[:-1], shape[-1] // 2) and got.dtype == dtype
    torch.testing.assert_close(got, want, **tol(dtype, "elementwise"))
