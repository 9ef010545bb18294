"""The runtime on a CUDA device: Triton kernels inside the models vs transformers, and CUDA graphs for decode.

Behind `-m gpu`; skipped without CUDA. (On a CUDA machine the fp32 tests of the other modules run there too.)
"""
import pytest
import torch

from kubeinfer.runtime.engine.cuda_graphs import graph_batch_sizes
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.reference import hf_greedy

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]
PROMPTS = ["Kubernetes runs containers", "a", "The key and value cache keeps the attention state of every token",
           "Unicode: café, 日本語 🙂", "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000"]
TOP_N = 5


def test_graph_batch_sizes():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(16) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_batch_sizes(256)[-3:] == [224, 240, 256] and len(graph_batch_sizes(256)) == 20


def test_dummy_weights_need_no_checkpoint(llama_dir, tmp_path):
    """load_format=dummy builds the model from config.json alone (benchmarks of large shapes)."""
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((llama_dir / name).read_bytes())
    llm = LLM(str(tmp_path), load_format="dummy", num_kvcache_blocks=16)
    out = llm.generate("hello", SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    norm = llm.engine.model_runner.model.model.norm.weight
    assert torch.equal(norm, torch.ones_like(norm))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_precision_on_cuda_close_to_transformers(model_dirs, arch, dtype):
    """Triton kernels in bf16/fp16 on the GPU: the top-N logprobs of every step stay close to transformers'
    fp32 ones. Teacher-forced: step s runs on the prompt plus transformers' first s tokens, so one
    rounding-induced flip of a near tie cannot cascade."""
    llm = LLM(str(model_dirs[arch]), dtype=dtype, device="cuda", kernel_backend="triton", num_kvcache_blocks=128)
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=TOP_N)
    for ids, (tokens, hf_logprobs) in zip(prompt_ids, hf_greedy(model_dirs[arch], prompt_ids, 6)):
        outputs = llm.generate([ids + tokens[:step] for step in range(len(tokens))], params)
        for output, hf_lp in zip(outputs, hf_logprobs):
            lp = output.logprobs[0]
            top = [t for t, _ in lp.top]
            torch.testing.assert_close(torch.tensor([v for _, v in lp.top]), hf_lp[top].float(), atol=0.05, rtol=0)


def _generate(model_dir, prompts, **settings):
    llm = LLM(str(model_dir), device="cuda", num_kvcache_blocks=256, **settings)
    # Different lengths: as sequences finish, the decode batch shrinks through every size from 13 to 1.
    params = [SamplingParams(max_tokens=4 + 2 * i, temperature=0, ignore_eos=True, logprobs=TOP_N)
              for i in range(len(prompts))]
    return llm, llm.generate(prompts, params)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3"])
def test_cuda_graphs_give_the_eager_outputs(model_dirs, arch, dtype):
    """Greedy tokens equal with and without graphs, logprobs close, while the decode batch shrinks from 13
    (above the largest graph, 8: eager) through sizes that need padding (7 -> 8, 3 -> 4) to 1, with
    sequences of mixed lengths (Mistral's sliding window included)."""
    prompts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS * 3)][:13]
    eager_llm, eager = _generate(model_dirs[arch], prompts, dtype=dtype, enforce_eager=True)
    assert eager_llm.engine.model_runner.cuda_graphs is None
    del eager_llm
    graph_llm, graphed = _generate(model_dirs[arch], prompts, dtype=dtype, cuda_graph_max_batch_size=8,
                                   max_num_seqs=13)
    graphs = graph_llm.engine.model_runner.cuda_graphs
    assert graphs is not None and graphs.batch_sizes == [1, 2, 4, 8]
    assert "cuda_graphs" in graph_llm.engine.startup_phases
    # one prefill step, then 27 decode steps; the last 16 of them have 8 sequences or fewer
    assert graphs.num_replays == 16
    tolerance = 1e-4 if dtype == "float32" else 0.05
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert abs(x.logprob - y.logprob) <= tolerance


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_on_cuda_gives_the_plain_greedy_tokens(model_dirs, method):
    """fp32 on the Triton kernels: verify steps (extend attention with short queries) and the draft model's own
    forwards replayed from CUDA graphs (each chunk padded to k + 1 tokens), its warm-up, beside plain decoding
    replayed from CUDA graphs: the same tokens, and the same logprobs as the eager speculative engine's."""
    prompts = [p * 3 for p in PROMPTS]
    _, plain = _generate(model_dirs["llama"], prompts, dtype="float32")
    settings = {"speculative_method": method, "speculative_ngram_min": 1}
    if method == "draft":
        settings = {"speculative_method": method, "speculative_model": str(model_dirs["llama"])}
    eager_llm, eager = _generate(model_dirs["llama"], prompts, dtype="float32", enforce_eager=True, **settings)
    del eager_llm
    llm, ours = _generate(model_dirs["llama"], prompts, dtype="float32", **settings)
    assert [o.token_ids for o in ours] == [o.token_ids for o in plain] == [o.token_ids for o in eager]
    for a, b in zip(eager, ours):
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
    assert llm.engine.scheduler.stats.num_accepted_tokens > 0
    runner = llm.engine.model_runner
    assert runner.verify_graphs is not None and runner.verify_graphs.num_replays > 0
    if method == "draft":
        assert runner.draft.graphs.num_replays > 0 and runner.draft.chunk_graphs.num_replays > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp8_kv_cache_on_cuda_holds_twice_the_tokens_and_stays_close_to_transformers(model_dirs):
    """bf16 weights over an FP8 (e4m3) cache on the GPU, with CUDA graphs: the same memory holds twice the blocks
    of a bf16 cache, and the teacher-forced top-N logprobs stay within 0.15 of transformers' fp32 ones (the bf16
    cache's bound is 0.05; the cost of 8 bits shows here)."""
    settings = dict(dtype="bfloat16", device="cuda", kernel_backend="triton", kv_cache_memory_gib=2 ** -11,
                    max_num_seqs=64)
    bf16_blocks = LLM(str(model_dirs["llama3"]), **settings).engine.model_runner.num_blocks
    llm = LLM(str(model_dirs["llama3"]), kv_cache_dtype="fp8_e4m3", **settings)
    assert llm.engine.model_runner.num_blocks == 2 * bf16_blocks
    assert llm.engine.model_runner.cuda_graphs is not None
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=TOP_N)
    for ids, (tokens, hf_logprobs) in zip(prompt_ids, hf_greedy(model_dirs["llama3"], prompt_ids, 6)):
        outputs = llm.generate([ids + tokens[:step] for step in range(len(tokens))], params)
        for output, hf_lp in zip(outputs, hf_logprobs):
            top = [t for t, _ in output.logprobs[0].top]
            torch.testing.assert_close(torch.tensor([v for _, v in output.logprobs[0].top]), hf_lp[top].float(),
                                       atol=0.15, rtol=0)


def test_gpu_settings_from_flags_and_env(monkeypatch, llama_dir):
    """--enforce-eager / KUBEINFER_ENFORCE_EAGER, --cuda-graph-max-batch-size and --load-format reach the engine
    settings; bad values are refused with the setting's name."""
    from kubeinfer.runtime.cli import build_parser, engine_settings
    from kubeinfer.runtime.config import EngineConfig
    from kubeinfer.runtime.errors import ConfigError

    args = build_parser().parse_args(["generate", "--model", "m", "--prompt", "x", "--enforce-eager",
                                      "--cuda-graph-max-batch-size", "32", "--load-format", "dummy"])
    settings = engine_settings(args)
    assert (settings["enforce_eager"], settings["cuda_graph_max_batch_size"], settings["load_format"]) == \
        (True, 32, "dummy")
    assert engine_settings(build_parser().parse_args(["generate", "--model", "m", "--prompt", "x"]))["enforce_eager"] \
        is False
    monkeypatch.setenv("KUBEINFER_ENFORCE_EAGER", "true")
    assert engine_settings(build_parser().parse_args(["generate", "--model", "m", "--prompt", "x"]))["enforce_eager"]
    with pytest.raises(ConfigError, match="load_format"):
        EngineConfig(model=str(llama_dir), load_format="npz")
    with pytest.raises(ConfigError, match="cuda_graph_max_batch_size"):
        EngineConfig(model=str(llama_dir), cuda_graph_max_batch_size=0)
