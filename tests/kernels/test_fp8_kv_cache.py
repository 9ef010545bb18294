"""The FP8 (e4m3) KV cache: store, decode and extend kernels against their references, and the references
against attention over the unquantized K/V.

A kernel reads the same FP8 bytes as its reference and dequantizes them the same way, so kernel vs reference
keeps the tight tolerances of the 16/32-bit cache; the cost of 8 bits shows only against full precision.
"""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.decode_attention import decode_attention  # noqa: E402
from kubeinfer.kernels.extend_attention import extend_attention  # noqa: E402
from kubeinfer.kernels.kv_store import store_kv  # noqa: E402
from kubeinfer.kernels.metadata import FP8_DTYPE, FP8_MAX  # noqa: E402

K_SCALE, V_SCALE = 0.5, 0.25   # not 1.0, so that a scale applied twice, or not at all, shows


def fp8_caches(k_cache, v_cache):
    return references.quantize_fp8(k_cache, K_SCALE), references.quantize_fp8(v_cache, V_SCALE)


@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (2, 80), (8, 128)])
def test_store_kv_fp8_matches_reference_and_saturates(device, dtype, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    num_tokens, num_blocks, block_size = 29, 4, 16
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[:3] = -1
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 3
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    key[5, 0, 0], value[6, 0, 1] = 1e4, -1e4            # beyond FP8_MAX * scale: saturates, never NaN
    key, value = key.to(device, dtype), value.to(device, dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(shape, dtype=FP8_DTYPE, device=device), torch.zeros(shape, dtype=FP8_DTYPE,
                                                                                       device=device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slot_mapping = slots.to(device)

    store_kv(key, value, k_cache, v_cache, slot_mapping, K_SCALE, V_SCALE)
    references.store_kv(key, value, k_ref, v_ref, slot_mapping, K_SCALE, V_SCALE)

    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    assert not k_cache.float().isnan().any() and not v_cache.float().isnan().any()
    s = int(slots[5])
    assert float(k_cache[s // block_size, s % block_size, 0, 0]) == FP8_MAX
    s = int(slots[6])
    assert float(v_cache[s // block_size, s % block_size, 0, 1]) == -FP8_MAX
    # What is stored is K / k_scale to e4m3's precision (3 mantissa bits: relative error <= 2^-4).
    t = 10
    s = int(slots[t])
    stored = k_cache[s // block_size, s % block_size].float() * K_SCALE
    torch.testing.assert_close(stored, key[t].float(), atol=2 ** -9, rtol=2 ** -4)


def test_store_kv_fp8_rounds_as_torch_casts_ties_and_powers_of_two(device, dtype):
    # Halfway between two e4m3 values (1.0625: 1.0 or 1.125) goes to the even one, as torch and the GPU round;
    # values at and just below a power of two, and subnormals, land on the grid torch's cast gives.
    values = torch.tensor([1.0625, 1.1875, 3.25, 3.75, 2.0 ** -8 * 2.5, 0.0029296875, 200.0, 208.0, 232.0, -1.0625,
                           -1.1875, 7.97, 8.0, 15.99, 0.25, 447.0, 0.0, -0.0, 2.0 ** -10])
    num_tokens = values.numel()
    key = values.view(num_tokens, 1, 1).repeat(1, 1, 16).to(device, dtype)
    k_cache = torch.zeros(1, num_tokens, 1, 16, dtype=FP8_DTYPE, device=device)
    v_cache = k_cache.clone()
    store_kv(key, key, k_cache, v_cache, torch.arange(num_tokens, device=device), 1.0, 1.0)
    assert torch.equal(k_cache[0].view(torch.uint8), key.float().to(FP8_DTYPE).view(torch.uint8))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("sliding_window", [None, 20])
def test_decode_fp8_matches_reference(device, dtype, tol, make_paged, num_heads, num_kv_heads, sliding_window):
    q, k_cache, v_cache, meta, _, _ = make_paged([1, 16, 33, 80, 47], [1] * 5, num_heads, num_kv_heads, 64, 16,
                                                 dtype, device, seed=11)
    k8, v8 = fp8_caches(k_cache, v_cache)
    got = decode_attention(q, k8, v8, meta, 0.125, sliding_window, k_scale=K_SCALE, v_scale=V_SCALE)
    want = references.decode_attention(q, k8, v8, meta, 0.125, sliding_window, K_SCALE, V_SCALE)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


@pytest.mark.parametrize("config", [(128, 4, 2, True, True), (64, 4, 2, False, True), (32, 4, 2, True, False)],
                         ids=["rows-first-fp16", "fp16", "rows-first"])
def test_decode_fp8_launch_variants_match_reference(device, dtype, tol, make_paged, config):
    # fp16 tiles (used for a bf16 query only): e4m3 -> fp16 is exact, so only the query's rounding changes.
    q, k_cache, v_cache, meta, _, _ = make_paged([1, 16, 33, 80, 47, 300], [1] * 6, 8, 2, 64, 16, dtype, device,
                                                 seed=13)
    k8, v8 = fp8_caches(k_cache, v_cache)
    got = decode_attention(q, k8, v8, meta, 0.125, k_scale=K_SCALE, v_scale=V_SCALE, config=config)
    want = references.decode_attention(q, k8, v8, meta, 0.125, None, K_SCALE, V_SCALE)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_decode_fp8_fp16_tiles_under_a_bf16_query_match_reference(tol, make_paged):
    # The path fp16_tiles exists for, on the default device (the interpreter on a CPU): a bf16 query, whose
    # values beyond fp16's range are clamped (one is set to 1e6 here: no inf, no NaN).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k_cache, v_cache, meta, _, _ = make_paged([1, 33, 80, 300], [1] * 4, 8, 2, 64, 16, torch.bfloat16, device,
                                                 seed=17)
    k8, v8 = fp8_caches(k_cache, v_cache)
    want = references.decode_attention(q, k8, v8, meta, 0.125, None, K_SCALE, V_SCALE)
    got = decode_attention(q, k8, v8, meta, 0.125, k_scale=K_SCALE, v_scale=V_SCALE, config=(64, 4, 2, True, True))
    torch.testing.assert_close(got, want, **tol(torch.bfloat16, "attention"))
    q[0, 0, 0] = 1e6
    assert decode_attention(q, k8, v8, meta, 0.125, k_scale=K_SCALE, v_scale=V_SCALE,
                            config=(64, 4, 2, True, True)).float().isfinite().all()


@pytest.mark.parametrize("q_lens", [[5, 1, 16], [33, 8, 2]])
def test_extend_fp8_matches_reference(device, dtype, tol, make_paged, q_lens):
    q, k_cache, v_cache, meta, _, _ = make_paged([40, 17, 70], q_lens, 8, 2, 64, 16, dtype, device, seed=5)
    k8, v8 = fp8_caches(k_cache, v_cache)
    got = extend_attention(q, k8, v8, meta, 0.125, k_scale=K_SCALE, v_scale=V_SCALE)
    want = references.extend_attention(q, k8, v8, meta, 0.125, None, K_SCALE, V_SCALE)
    torch.testing.assert_close(got, want, **tol(dtype, "attention"))


def test_fp8_attention_stays_close_to_full_precision(make_paged):
    """The price of 8 bits, on the reference path: attention over the FP8 cache against attention over the
    cache it was quantized from. Scores of random unit-variance K/V move by a few percent; the bound stated
    here (0.08 absolute on outputs of unit scale) is what docs/runtime.md quotes."""
    q, k_cache, v_cache, meta, _, _ = make_paged([64, 200, 31], [1, 1, 1], 8, 2, 64, 16, torch.float32, "cpu",
                                                 seed=2)
    k8, v8 = references.quantize_fp8(k_cache, 1.0), references.quantize_fp8(v_cache, 1.0)
    exact = references.decode_attention(q, k_cache, v_cache, meta, 0.125)
    approx = references.decode_attention(q, k8, v8, meta, 0.125)
    error = (approx - exact).abs().max().item()
    assert 0 < error < 0.08, error


def test_a_model_over_the_fp8_cache_with_the_triton_kernels_matches_the_reference_path(tmp_path):
    """The whole path: a small Llama on the Triton kernels (interpreter) and on the PyTorch references, both
    over an FP8 cache, with prefix caching and a chunked prefill: same greedy tokens, logprobs equal to
    fp32 summation order. The FP8 path through every kernel the model calls (the scales' arithmetic, with
    values other than the engine's 1.0, is the kernel tests' above)."""
    from kubeinfer.runtime.demo import train_tokenizer, write_llama_model
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    write_llama_model(tmp_path, train_tokenizer(256), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    prompts = ["a paged cache of keys and values " * 3, "a paged cache of keys"]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3)
    runs = []
    for backend in ("triton", "torch"):
        llm = LLM(str(tmp_path), kernel_backend=backend, kv_cache_dtype="fp8_e4m3", num_kvcache_blocks=32,
                  max_num_batched_tokens=16, max_model_len=256)
        runs.append(llm.generate(prompts, params))
    for triton_out, torch_out in zip(*runs):
        assert triton_out.token_ids == torch_out.token_ids
        for a, b in zip(triton_out.logprobs, torch_out.logprobs):
            torch.testing.assert_close(torch.tensor([v for _, v in a.top]), torch.tensor([v for _, v in b.top]),
                                       atol=1e-4, rtol=0)
