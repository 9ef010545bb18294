"""The native CPU paged attention (kernels/csrc/paged_attention_cpu.c) against the PyTorch reference.

Odd shapes on purpose: head sizes with and without a specialised build (64, 128; 80, 32), GQA ratios 1 to 8,
block sizes from 1 up, lengths crossing block and key-chunk edges, one-token prompts, mixed batches (decodes,
speculative drafts, long prefill chunks after cached prefixes), sliding windows narrower than a block, batches
small enough to split by KV head, queries that are strided views, and sequences whose blocks lie anywhere.
"""

import pytest
import torch

from kubeinfer.kernels import cpu_attention, cpu_native, ops, references, set_backend
from kubeinfer.kernels.backend import get_backend

if cpu_native.library("paged_attention_cpu") is None:
    pytest.skip("no C compiler here: the native CPU kernels are not built (the references run instead)",
                allow_module_level=True)

# (seq_len, query chunk): one-token prompt, decodes past a 32-key decode chunk, drafts, prefill past a 64-key chunk
# and a 16-token tile,
# chunks after a cached prefix, a long chunk whose last tile is partial.
MIXED = [(1, 1), (37, 1), (300, 1), (70, 5), (80, 80), (47, 15), (200, 140), (129, 17), (64, 64)]
# Long prefill chunks beside decodes in one call: 256 tokens, 400 after a cached prefix, a whole long prompt.
LONG = [(256, 256), (700, 400), (530, 530), (40, 1), (90, 7)]


def check(make_paged, pairs, num_heads, num_kv_heads, head_dim, block_size, sliding_window=None, seed=0,
          cache_dtype=torch.float32):
    """Against the reference in fp32; a bf16 cache against the reference over the same values widened to fp32
    (what the kernel must compute: its arithmetic is fp32 either way)."""
    seq_lens, q_lens = zip(*pairs)
    q, k_cache, v_cache, meta, _, _ = make_paged(list(seq_lens), list(q_lens), num_heads, num_kv_heads, head_dim,
                                                 block_size, torch.float32, "cpu", seed=seed)
    k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    scale = head_dim ** -0.5
    got = cpu_attention.paged_attention(q, k_cache, v_cache, meta, scale, sliding_window)
    want = references.paged_attention(q, k_cache.float(), v_cache.float(), meta, scale, sliding_window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (8, 1), (2, 1), (14, 2), (32, 8)],
                         ids=["mha", "gqa4", "gqa8", "mqa2", "gqa7", "llama3"])
@pytest.mark.parametrize("head_dim", [64, 128, 80, 32])
@pytest.mark.parametrize("block_size", [1, 16, 32, 64])   # 64: a decode item's 32-key chunk starts mid-block
def test_mixed_batch_matches_reference(make_paged, num_heads, num_kv_heads, head_dim, block_size):
    check(make_paged, MIXED, num_heads, num_kv_heads, head_dim, block_size, seed=head_dim + block_size)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (32, 8)], ids=["mha", "gqa4", "llama3"])
@pytest.mark.parametrize("head_dim", [64, 128, 80, 32])
@pytest.mark.parametrize("block_size", [1, 16])
def test_bf16_cache_matches_reference_over_its_widened_values(make_paged, num_heads, num_kv_heads, head_dim,
                                                              block_size):
    """The bf16 build (csrc/paged_attention_cpu_bf16kv.c): decodes, drafts, prefill tiles and long chunks."""
    for pairs in (MIXED, LONG):
        check(make_paged, pairs, num_heads, num_kv_heads, head_dim, block_size, seed=head_dim + block_size,
              cache_dtype=torch.bfloat16)
    check(make_paged, MIXED, num_heads, num_kv_heads, head_dim, block_size, sliding_window=20, seed=head_dim,
          cache_dtype=torch.bfloat16)


@pytest.mark.parametrize("sliding_window", [1, 7, 16, 20, 65, 4096])
def test_sliding_window(make_paged, sliding_window):
    check(make_paged, MIXED, 8, 2, 64, 16, sliding_window, seed=sliding_window)
    check(make_paged, LONG, 8, 2, 64, 16, sliding_window, seed=sliding_window)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 2, 64), (4, 4, 80), (8, 1, 128)])
def test_long_chunks_beside_decodes(make_paged, num_heads, num_kv_heads, head_dim):
    check(make_paged, LONG, num_heads, num_kv_heads, head_dim, 16, seed=head_dim)


@pytest.mark.parametrize("num_seqs", [1, 2, 7, 8, 40])
def test_decode_batches_split_by_head_or_whole(make_paged, num_seqs):
    """Fewer sequences than 4 per thread are split by KV head; more run whole. Both agree with the reference."""
    check(make_paged, [(5 + 37 * i, 1) for i in range(num_seqs)], 8, 2, 64, 16, seed=num_seqs)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count(make_paged, threads):
    """Also: with one KV head, a whole sequence's chunk of up to 64 tokens is one item (not a 16-token tile)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)   # the kernel runs in torch's OpenMP pool
    try:
        check(make_paged, MIXED, 8, 2, 64, 16, seed=threads)
        check(make_paged, MIXED, 2, 1, 16, 16, seed=threads)
    finally:
        torch.set_num_threads(before)


def test_strided_query_view(make_paged):
    """q as the model passes it: a view into the fused QKV projection's output."""
    q, k_cache, v_cache, meta, _, _ = make_paged([90, 3, 33], [90, 1, 2], 8, 2, 64, 16, torch.float32, "cpu")
    qkv = torch.cat([q.flatten(1), torch.randn(q.shape[0], 2 * 2 * 64)], dim=1)
    view = qkv[:, :8 * 64].view(-1, 8, 64)
    assert not view.is_contiguous()
    torch.testing.assert_close(cpu_attention.paged_attention(view, k_cache, v_cache, meta, 0.125),
                               references.paged_attention(q, k_cache, v_cache, meta, 0.125), atol=2e-5, rtol=2e-5)


def test_scope_left_to_the_reference():
    """Other dtypes and very large heads are not this kernel's: `supports` says so and ops takes the reference."""
    cache = torch.zeros(4, 16, 2, 64)
    assert cpu_attention.supports(torch.zeros(1, 4, 64), cache)
    assert cpu_attention.supports(torch.zeros(1, 4, 64, dtype=torch.bfloat16), cache.bfloat16())
    assert not cpu_attention.supports(torch.zeros(1, 4, 64, dtype=torch.bfloat16), cache.half())
    assert not cpu_attention.supports(torch.zeros(1, 4, 512), torch.zeros(4, 16, 2, 512))


def test_ops_route_by_backend(make_paged, monkeypatch):
    """"auto" and "cpu" take the native kernel on CPU fp32; "torch" (the tests' oracle) never does."""
    q, k_cache, v_cache, meta, _, _ = make_paged([20, 9], [20, 1], 4, 2, 64, 16, torch.float32, "cpu")
    calls = []
    native = cpu_attention.paged_attention
    monkeypatch.setattr(cpu_attention, "paged_attention", lambda *a, **k: calls.append(1) or native(*a, **k))
    before = get_backend()
    try:
        for backend, expected in (("auto", 1), ("cpu", 2), ("torch", 2)):
            set_backend(backend)
            ops.paged_attention(q, k_cache, v_cache, meta, 0.125)
            assert len(calls) == expected, backend
    finally:
        set_backend(before)


def test_without_a_compiler_the_reference_runs(tmp_path, monkeypatch, caplog):
    """No compiler on the machine: one warning, no library, and the ops still answer (by the reference)."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("KUBEINFER_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_native, "_loaded", {})
    with caplog.at_level("WARNING"):
        assert cpu_native.library("paged_attention_cpu") is None
    assert "could not build the native CPU kernel" in caplog.text


def test_build_is_cached_by_source_and_cpu(tmp_path, monkeypatch):
    """The cache key, with a stand-in compiler that writes empty outputs (the real build runs in every other test
    here): the same inputs reuse the file, another instruction set or CPU builds again."""
    compiler = tmp_path / "fake-cc"
    compiler.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "fake-cc 1.0"; exit 0; }\n'
                        'while [ $# -gt 0 ]; do [ "$1" = -o ] && : > "$2"; shift; done\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("KUBEINFER_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cpu_native.MARCH_ENV, raising=False)   # the first build for this CPU, however the suite runs
    first = cpu_native._build("paged_attention_cpu", str(compiler))
    assert first.parent == tmp_path / "cache" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert cpu_native._build("paged_attention_cpu", str(compiler)) == first and first.stat().st_mtime_ns == stamp
    monkeypatch.setenv(cpu_native.MARCH_ENV, "x86-64-v3")   # another instruction set: another build
    assert cpu_native._build("paged_attention_cpu", str(compiler)) != first
    monkeypatch.delenv(cpu_native.MARCH_ENV)
    monkeypatch.setattr(cpu_native, "_cpu_identity", lambda: "another CPU")
    assert cpu_native._build("paged_attention_cpu", str(compiler)) != first


def test_loading_the_library_leaves_the_process_floats_alone():
    """-ffast-math at link time would load crtfastmath.o, which flushes subnormals to zero process-wide (caught
    once by the server's fuzz test: hypothesis refuses to run in such a process)."""
    import subprocess
    import sys
    script = ("import torch\n"
              "from kubeinfer.kernels import cpu_native\n"
              "assert cpu_native.library('paged_attention_cpu') is not None\n"
              "tiny = 5e-324\n"
              "print(tiny * 1.0 != 0.0, float(torch.tensor([1e-40]) * 1.0) != 0.0)")
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr


def test_bf16_queries_over_an_fp32_cache(make_paged):
    """A bf16 model on the CPU keeps an fp32 cache (runtime.engine.model_runner.kv_cache_dtype): its queries are
    attended in fp32 and the output comes back in bf16, as the reference in fp32 rounded once."""
    q, k_cache, v_cache, meta, _, _ = make_paged([40, 300, 70], [40, 1, 5], 8, 2, 64, 16, torch.float32, "cpu", seed=7)
    q16 = q.to(torch.bfloat16)
    got = ops.paged_attention(q16, k_cache, v_cache, meta, 64 ** -0.5)
    want = references.paged_attention(q16.float(), k_cache, v_cache, meta, 64 ** -0.5).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=0, rtol=2 ** -7)


def test_store_kv_of_bf16_rows_into_an_fp32_cache():
    k_cache, v_cache = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)
    key, value = torch.randn(3, 1, 8).to(torch.bfloat16), torch.randn(3, 1, 8).to(torch.bfloat16)
    ops.store_kv(key, value, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(k_cache.view(-1, 8)[[5, 0]], key[[0, 2], 0].float())
    assert torch.equal(v_cache.view(-1, 8)[[5, 0]], value[[0, 2], 0].float())
    assert k_cache.view(-1, 8)[1:5].abs().sum() == 0
