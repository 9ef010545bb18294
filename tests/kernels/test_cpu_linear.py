"""bf16 and fp32 linear layers over weights packed for oneDNN (kernels/cpu_linear.py) against F.linear, and in a
model."""
import pytest
import torch
import torch.nn.functional as F

from kubeinfer.kernels import cpu_linear

needs_packing = pytest.mark.skipif(not cpu_linear.can_pack(torch.empty(2, 2, dtype=torch.bfloat16)),
                                   reason="this torch or CPU has no oneDNN bf16 GEMM")


@needs_packing
@pytest.mark.parametrize("tokens", [1, 3, 64, 130])
@pytest.mark.parametrize("features", [(72, 130), (512, 1536)], ids=["odd", "model"])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear_up_to_bf16_rounding(tokens, features, bias):
    ours, theirs, exact = packed_and_plain_errors(torch.bfloat16, tokens, features, bias)
    # Within a bf16 rounding of the exact result, as F.linear's own bf16 output is.
    assert ours <= max(2 * theirs, 2 ** -7 * exact.abs().max())


def packed_and_plain_errors(dtype: torch.dtype, tokens: int, features: tuple[int, int], bias: bool):
    """Max error against the exact (fp64) product of the packed linear and of F.linear, and that product; the
    packed output's dtype and shape checked on the way."""
    torch.manual_seed(tokens)
    in_features, out_features = features
    x = torch.randn(tokens, in_features, dtype=dtype)
    weight = torch.randn(out_features, in_features, dtype=dtype) / in_features ** 0.5
    b = torch.randn(out_features, dtype=dtype) if bias else None
    got = cpu_linear.linear(x, cpu_linear.pack(weight), b)
    exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
    assert got.dtype == dtype and got.shape == (tokens, out_features)
    return (got.double() - exact).abs().max(), (F.linear(x, weight, b).double() - exact).abs().max(), exact


@needs_packing
def test_a_non_contiguous_input_is_accepted():
    x = torch.randn(8, 64, dtype=torch.bfloat16)[::2]
    weight = torch.randn(32, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(cpu_linear.linear(x, cpu_linear.pack(weight)), F.linear(x, weight), atol=0.1, rtol=0.02)


needs_fp32_packing = pytest.mark.skipif(not cpu_linear.can_pack(torch.empty(2, 2)),
                                        reason="this torch has no oneDNN linear")


@needs_fp32_packing
@pytest.mark.parametrize("tokens", [1, 3, 64, 300])
@pytest.mark.parametrize("features", [(72, 130), (512, 1536)], ids=["odd", "model"])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_fp32_linear_equals_f_linear_up_to_summation_order(tokens, features, bias):
    ours, theirs, _ = packed_and_plain_errors(torch.float32, tokens, features, bias)
    assert ours <= max(4 * theirs, 1e-5)


def test_bf16_and_fp32_cpu_weights_are_packed_and_nothing_else():
    assert cpu_linear.can_pack(torch.empty(4, 4)) == cpu_linear.can_pack(torch.empty(4, 4, dtype=torch.float32))
    assert not cpu_linear.can_pack(torch.empty(4, 4, dtype=torch.float16))
    assert not cpu_linear.can_pack(torch.empty(4, dtype=torch.bfloat16))
    assert not cpu_linear.can_pack(torch.empty(4))


@needs_packing
def test_layers_pack_once_and_free_the_plain_weight():
    from kubeinfer.runtime.layers.linear import MergedColumnParallelLinear, RowParallelLinear, pack_cpu_weights
    torch.manual_seed(0)
    model = torch.nn.Sequential(MergedColumnParallelLinear(64, [96, 96]), RowParallelLinear(96, 64, bias=True))
    for param in model.parameters():
        param.data = torch.randn_like(param, dtype=torch.bfloat16) / 8
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    want = model[1](model[0](x)[:, :96])
    assert pack_cpu_weights(model) == 2 and pack_cpu_weights(model) == 0
    assert model[0].weight.numel() == 0   # only the packed copy is held
    torch.testing.assert_close(model[1](model[0](x)[:, :96]), want, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_untied_lm_head_packs_and_a_tied_one_packs_a_copy_beside_the_embeddings_weight(dtype):
    if not cpu_linear.can_pack(torch.empty(2, 2, dtype=dtype)):
        pytest.skip(f"this torch or CPU has no oneDNN {dtype} GEMM")
    from kubeinfer.runtime.layers.embedding import ParallelLMHead
    tolerance = dict(atol=0.1, rtol=0.02) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-5)
    head = ParallelLMHead(100, 64)
    head.weight.data = torch.randn(100, 64, dtype=dtype)
    hidden = torch.randn(3, 64, dtype=dtype)
    want = head(hidden)
    assert head.pack_weight() and head.weight.numel() == 0
    torch.testing.assert_close(head(hidden), want, **tolerance)
    tied = ParallelLMHead(100, 64)
    tied.weight.data = torch.randn(100, 64, dtype=dtype)
    tied.tied = True
    plain, want = tied.weight.data.clone(), tied(hidden)
    assert tied.pack_weight() and not tied.pack_weight()
    assert torch.equal(tied.weight.data, plain)   # the embedding's rows, untouched
    torch.testing.assert_close(tied(hidden), want, **tolerance)
