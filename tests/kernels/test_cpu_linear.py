"""bf16 and fp32 linear layers over weights packed for oneDNN, and fp32 over panels (kernels/cpu_linear.py,
csrc/linear_cpu.c), against F.linear and the exact product, and in a model."""
import os

import pytest
import torch
import torch.nn.functional as F

from kubeinfer.kernels import cpu_linear, cpu_native
from support.weights import use_linear_layout

NO_PANELS = "the panel kernel needs AVX2 and FMA, and a C compiler"


@pytest.fixture
def panels_here(monkeypatch):
    """The panel kernel, looked up afresh under the default choice (KUBEINFER_CPU_LINEAR=auto)."""
    use_linear_layout(monkeypatch, "auto")
    if cpu_linear._panel_kernel() is None:
        pytest.skip(NO_PANELS)


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


@pytest.fixture(params=["panels", "onednn"])
def fp32_layout(request, monkeypatch):
    """Each fp32 layout `pack` may choose: panels (where their kernel runs here) and oneDNN's."""
    use_linear_layout(monkeypatch, "auto" if request.param == "panels" else "onednn")
    if request.param == "panels" and cpu_linear._panel_kernel() is None:
        pytest.skip(NO_PANELS)
    return request.param


@needs_fp32_packing
@pytest.mark.parametrize("tokens", [1, 3, 64, 300])
@pytest.mark.parametrize("features", [(72, 130), (512, 1536)], ids=["odd", "model"])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_fp32_linear_equals_f_linear_up_to_summation_order(tokens, features, bias, fp32_layout):
    assert isinstance(cpu_linear.pack(torch.ones(2, 2)), cpu_linear.Panels) == (fp32_layout == "panels")
    ours, theirs, _ = packed_and_plain_errors(torch.float32, tokens, features, bias)
    assert ours <= max(4 * theirs, 1e-5)


# Row counts on both sides of the kernel's boundaries (6 rows a micro-kernel and the in-place path, 192 a packed
# block), K past its block (640 wide for 16-wide panels, 320 for 32-wide: 1,283 is three or five blocks), outputs
# that leave a partial last panel or span several chunks of 256 outputs (960).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [0, 1, 5, 6, 7, 13, 192, 193, 203])
@pytest.mark.parametrize("features", [(5, 17), (72, 130), (1283, 33), (576, 960)])
def test_panels_equal_the_exact_product_at_every_boundary(tokens, features, dtype, panels_here):
    torch.manual_seed(tokens)
    in_features, out_features = features
    weight = (torch.randn(out_features, in_features) / in_features ** 0.5).to(dtype)
    bias = torch.randn(out_features, dtype=dtype)
    panels = cpu_linear.to_panels(weight)
    width = cpu_linear.panel_width()
    assert panels.data.shape == (-(-out_features // width), in_features, width) and panels.data.dtype == dtype
    x = torch.randn(tokens, in_features + 8, dtype=dtype)[:, 3:in_features + 3]   # rows at a stride: a wider row's view
    for b in (None, bias):
        got = cpu_linear.panel_linear(x, panels, b)
        exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
        plain = F.linear(x, weight, b).double()
        assert got.shape == (tokens, out_features) and got.dtype == dtype
        if tokens:   # fp32: within a few of F.linear's summation errors, or within the bound of a sum in k order
            # (in_features roundings of at most 2^-24 of the sum of the products' magnitudes: a missing or wrong
            # product is far beyond it); bf16: one rounding of the fp32 sum, as theirs
            error, theirs = (got.double() - exact).abs().max(), (plain - exact).abs().max()
            magnitude = F.linear(x.double().abs(), weight.double().abs(), None if b is None else b.double().abs())
            in_order = (in_features * 2 ** -24 * magnitude).max()
            one_rounding = max(theirs, 2 ** -8 * exact.abs().max())
            bound = max(4 * theirs, 1e-5, in_order) if dtype == torch.float32 else one_rounding
            assert error <= bound
    batched = torch.randn(2, 3, in_features, dtype=dtype)
    torch.testing.assert_close(cpu_linear.panel_linear(batched, panels), F.linear(batched, weight),
                               **(dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}))


def test_the_panel_width_is_the_cpus_and_panels_of_another_are_refused_not_misread(panels_here):
    """32 outputs a panel where the build has AVX-512 (this CPU's own, unless KUBEINFER_KERNEL_MARCH says another),
    16 with AVX2 only; panels of the other width would be read as garbage, so they are refused."""
    if not os.environ.get(cpu_native.MARCH_ENV):
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
        assert cpu_linear.panel_width() == (32 if "avx512f" in flags else 16)
    other = 48 - cpu_linear.panel_width()
    panels = cpu_linear.to_panels(torch.randn(40, 8), width=other)
    assert panels.data.shape == (-(-40 // other), 8, other)
    with pytest.raises(ValueError, match=f"panels {other} wide"):
        cpu_linear.panel_linear(torch.randn(2, 8), panels)


def test_bf16_takes_panels_only_where_onednn_has_no_bf16_gemm(panels_here):
    """With one (AVX512-BF16, AMX) oneDNN runs bf16 at twice the panels' rate from 16 rows up; fp32 takes panels
    wherever their kernel runs."""
    bf16 = torch.ones(4, 4, dtype=torch.bfloat16)
    assert isinstance(cpu_linear.pack(torch.ones(4, 4)), cpu_linear.Panels)
    assert isinstance(cpu_linear.pack(bf16), cpu_linear.Panels) == (not torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_an_input_of_another_dtype_than_the_panels_is_refused_not_misread():
    panels = cpu_linear.to_panels(torch.randn(16, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16 CPU linear got a torch.float32 input"):
        cpu_linear.panel_linear(torch.randn(2, 8), panels)
    with pytest.raises(TypeError, match="not torch.float16"):
        cpu_linear.to_panels(torch.randn(16, 8, dtype=torch.float16))


def test_the_onednn_choice_keeps_oneDNN_for_fp32(monkeypatch):
    use_linear_layout(monkeypatch, "onednn")
    assert cpu_linear._panel_kernel() is None
    if cpu_linear.can_pack(torch.empty(2, 2)):
        assert not isinstance(cpu_linear.pack(torch.ones(4, 4)), cpu_linear.Panels)


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


def test_an_lm_heads_logits_past_the_mmap_threshold_reuse_one_buffer_until_sleep_frees_it(panels_here):
    """A step's logits over 32 MiB are written into the head's kept buffer (fresh pages cost a fault each, every
    step): equal to F.linear's, the same memory on the next call of as many rows or fewer, and freed by
    `release_output`. Below the threshold each call returns a new tensor."""
    from kubeinfer.runtime.cpu_allocator import MMAP_THRESHOLD_BYTES
    from kubeinfer.runtime.layers.embedding import ParallelLMHead
    vocab, hidden_size = 40_000, 16
    rows = MMAP_THRESHOLD_BYTES // (vocab * 4) + 1
    head = ParallelLMHead(vocab, hidden_size)
    head.weight.data = torch.randn(vocab, hidden_size)
    weight = head.weight.data.clone()
    assert head.pack_weight()
    hidden = torch.randn(rows + 2, hidden_size)
    first = head(hidden[:rows])
    torch.testing.assert_close(first, F.linear(hidden[:rows], weight), atol=1e-4, rtol=1e-5)
    second = head(hidden)
    assert second.data_ptr() != first.data_ptr()   # more rows: a larger buffer
    third = head(hidden[1:rows + 1])
    assert third.data_ptr() == second.data_ptr()
    torch.testing.assert_close(third, F.linear(hidden[1:rows + 1], weight), atol=1e-4, rtol=1e-5)
    head.release_output()
    assert head._kept is None
    small = head(hidden[:2])
    assert head._kept is None and small.data_ptr() != head(hidden[:2]).data_ptr()
    with pytest.raises(ValueError, match="cannot write"):
        cpu_linear.panel_linear(hidden[:2], head.packed, out=torch.empty(3, vocab))


def test_a_rows_panel_result_does_not_depend_on_the_rows_beside_it(panels_here):
    """Every row runs the same sums in the same order at any row count (K blocks continue one accumulator), so a
    sequence's logits do not change with the batch it rides in."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        weight, bias = torch.randn(40, 1536, dtype=dtype), torch.randn(40)
        panels, x = cpu_linear.to_panels(weight), torch.randn(400, 1536, dtype=dtype)
        together = cpu_linear.panel_linear(x, panels, bias)
        for start, count in [(0, 1), (7, 1), (3, 5), (0, 13), (100, 97), (190, 200)]:   # both paths, past a block
            alone = cpu_linear.panel_linear(x[start:start + count], panels, bias)
            assert torch.equal(alone, together[start:start + count]), (dtype, start, count)
