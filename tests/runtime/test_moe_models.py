"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) against transformers on the same random checkpoints:
greedy tokens and top-5 logprobs in fp32, in one mixed-length batch with chunked prefill; then the engine's other
paths (prefix-cache hits, preemption, speculative decoding) give the same tokens."""
import pytest
import torch

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.models.config import ModelConfig
from kubeinfer.runtime.sampling_params import SamplingParams
from support.reference import assert_same_outputs, hf_greedy

MOE_ARCHS = ["mixtral", "qwen2moe", "qwen3moe"]
PROMPTS = ["Kubernetes runs containers on nodes, and the scheduler places each pod", "a",
           "The key and value cache keeps the attention state of every token",
           "Unicode: café, 日本語 🙂", "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000"]
MAX_TOKENS = 12
TOP_N = 5


def test_configs_say_which_layers_route(moe_dirs):
    mixtral, qwen2, qwen3 = (ModelConfig.from_dir(moe_dirs[arch]) for arch in MOE_ARCHS)
    assert mixtral.moe.sparse_layers == (True,) * 3 and mixtral.moe.renormalize and mixtral.moe.weights_in_fp32
    assert qwen2.moe.shared_expert_intermediate_size == 96 and not qwen2.moe.renormalize
    assert qwen3.moe.sparse_layers == (True, False, True) and qwen3.moe.renormalize
    assert (qwen3.moe.num_experts, qwen3.moe.top_k, qwen3.moe.intermediate_size) == (8, 2, 32)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_greedy_tokens_and_logprobs_match_transformers(moe_dirs, arch):
    with LLM(str(moe_dirs[arch]), max_num_batched_tokens=32, num_kvcache_blocks=64) as llm:
        prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N)
        ours = llm.generate(prompt_ids, params)   # one batch, mixed lengths, chunked prefill (32-token steps)
    assert_same_outputs(ours, hf_greedy(moe_dirs[arch], prompt_ids, MAX_TOKENS), top_n=TOP_N)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_prefix_hits_preemption_and_speculation_keep_the_tokens(moe_dirs, arch):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    with LLM(str(moe_dirs[arch]), max_num_batched_tokens=64, num_kvcache_blocks=128) as llm:
        prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
        want = [o.token_ids for o in llm.generate(prompt_ids, params)]
        again = llm.generate(prompt_ids, params)   # the prompts' full blocks now come from the prefix cache
        assert [o.token_ids for o in again] == want
        assert sum(o.num_cached_tokens for o in again) > 0
    # 6 blocks of 16 cannot hold five sequences at once: the newest are preempted and recomputed.
    with LLM(str(moe_dirs[arch]), max_num_batched_tokens=64, num_kvcache_blocks=6, max_model_len=96) as llm:
        assert [o.token_ids for o in llm.generate(prompt_ids, params)] == want
        assert llm.engine.scheduler.stats.num_preemptions > 0
    with LLM(str(moe_dirs[arch]), max_num_batched_tokens=64, num_kvcache_blocks=128, speculative_method="ngram",
             speculative_tokens=3) as llm:
        assert [o.token_ids for o in llm.generate(prompt_ids, params)] == want


@pytest.mark.parametrize("arch,parallel", [
    ("qwen2moe", {"tensor_parallel_size": 2}), ("mixtral", {"tensor_parallel_size": 2}),
    ("qwen3moe", {"tensor_parallel_size": 2, "expert_parallel_size": 2}),
    ("qwen2moe", {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
    ("qwen3moe", {"expert_parallel_size": 2})],
    ids=["qwen2moe-tp2", "mixtral-tp2", "qwen3moe-ep2", "qwen2moe-ep2", "qwen3moe-ep2-attention-replicated"])
def test_two_ranks_match_one_on_real_processes(moe_dirs, arch, parallel):
    """Two processes over gloo. TP: every rank holds every expert with half its width (Qwen2-MoE's shared expert
    too). EP: each holds 4 of the 8 experts, whole, and computes their share of every token, with attention split
    over the same two ranks or (tensor_parallel_size 1) whole on each. Either way the partial sums are all-reduced:
    the same greedy tokens as one rank, logprobs within summation-order error."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N)
    outputs = []
    for settings in ({}, parallel):
        with LLM(str(moe_dirs[arch]), max_num_batched_tokens=32, num_kvcache_blocks=64, **settings) as llm:
            if settings:
                layers = llm.engine.model_runner.model.model.layers
                layer = next(layer for layer in layers if hasattr(layer.mlp, "experts"))   # a sparse layer
                experts = 4 if settings.get("expert_parallel_size") or settings.get("enable_expert_parallel") else 8
                assert layer.mlp.experts.w13.shape[0] == experts   # rank 0's experts
                heads = llm.engine.config.model_config.num_heads // settings.get("tensor_parallel_size", 1)
                assert layer.self_attn.num_heads == heads   # rank 0's attention heads
            outputs.append(llm.generate([llm.tokenizer.encode(p) for p in PROMPTS], params))
    assert_same_outputs(outputs[1], outputs[0], top_n=TOP_N)


@pytest.mark.parametrize("settings,message", [
    ({"tensor_parallel_size": 4, "expert_parallel_size": 4}, "expert_parallel_size 4 does not divide the model's 6 "
                                                             "experts; use a divisor of 6"),
    ({"tensor_parallel_size": 2, "expert_parallel_size": 4}, "must equal tensor_parallel_size 2"),
    ({"expert_parallel_size": 4}, "expert_parallel_size 4 does not divide the model's 6 experts"),
    ({"tensor_parallel_size": 4}, "tensor_parallel_size 4 does not divide the experts' intermediate size 6"),
])
def test_bad_expert_settings_are_one_line_errors(moe_dirs, tmp_path, settings, message):
    """Checked when the engine's settings are read, before any process starts or weight loads."""
    import json
    import shutil
    from kubeinfer.runtime.config import EngineConfig
    from kubeinfer.runtime.errors import ConfigError
    folder = shutil.copytree(moe_dirs["mixtral"], tmp_path / "six-experts")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_local_experts": 6, "intermediate_size": 6}))
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model=str(folder), **settings)


def test_expert_parallelism_needs_an_moe_model(model_dirs):
    from kubeinfer.runtime.config import EngineConfig
    from kubeinfer.runtime.errors import ConfigError
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model; LlamaForCausalLM is dense"):
        EngineConfig(model=str(model_dirs["llama"]), tensor_parallel_size=2, expert_parallel_size=2)


def test_expert_load_is_counted_per_expert_and_exported(moe_dirs):
    """Every routed (token, expert) pair is counted once: tokens x top-k x sparse layers in all; the Prometheus
    series carry the same sums."""
    from kubeinfer.runtime.layers.fused_moe import expert_load_summary
    from kubeinfer.runtime.server.metrics import EngineMetrics
    with LLM(str(moe_dirs["qwen3moe"]), max_num_batched_tokens=32, num_kvcache_blocks=64) as llm:
        core = llm.engine.core
        assert sum(map(sum, core.model_runner.expert_load())) == 0   # nothing counted at start-up
        prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
        llm.generate(prompt_ids, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        per_layer = core.model_runner.expert_load()
        computed = sum(map(len, prompt_ids)) + 3 * len(prompt_ids)   # the last token of each is sampled, not run
        assert len(per_layer) == 2 and [sum(layer) for layer in per_layer] == [computed * 2] * 2   # 2 sparse layers
        stats = core.stats(fresh=True)
    assert stats.expert_tokens == expert_load_summary(per_layer)[0] and stats.expert_imbalance >= 1.0
    metrics = EngineMetrics("m")
    metrics.observe_stats(stats, None)
    text = __import__("prometheus_client").generate_latest(metrics.registry).decode()
    exported = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kubeinfer_moe_expert_routed_tokens_total{"))
    assert exported == sum(stats.expert_tokens) == computed * 2 * 2


def test_the_engine_loop_reads_the_load_fresh_on_its_last_step_before_idling():
    """The load is read at most once a second while steps run; the step that leaves nothing unfinished reads it
    then, so that the exported counts are exact once traffic stops (they stayed up to a second behind, for good)."""
    from kubeinfer.runtime.engine.core_loop import serve_core
    from kubeinfer.runtime.engine.messages import AddRequest, Shutdown, StepsRead

    class Core:
        unfinished, reads, step_tenant_tokens = 0, [], {}
        idle_wait_s = None   # no KV source to poll for
        kv_importer = None   # no KV pulls (decode role) either
        request_wakes = []   # never asleep (engine/sleep.py)

        def add(self, *_):
            self.unfinished = 3   # three steps to run

        def has_unfinished(self):
            return self.unfinished > 0

        def step(self):
            self.unfinished -= 1
            return []

        def stats(self, fresh=False):
            self.reads.append(fresh)

        def take_failures(self):   # requests the engine ended with an error: none here
            return []

    class Channel:
        inbox = [[AddRequest("r", [1], None, None, [])], [Shutdown()]]

        def receive(self, timeout):   # the API side reads each step as it comes
            return self.inbox.pop(0) if timeout is None else [StepsRead(1)]

        def send(self, message):
            pass

    core = Core()
    serve_core(core, Channel())
    assert core.reads == [False, False, True]


def test_expert_load_summary():
    from kubeinfer.runtime.layers.fused_moe import expert_load_summary
    assert expert_load_summary([[1, 3], [2, 2]]) == ((3, 5), 1.5)
    assert expert_load_summary([[0, 0]]) == ((0, 0), 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_triton_moe_on_cuda_with_graphs_gives_the_eager_outputs_and_transformers(moe_dirs, arch):
    """The grouped-GEMM kernel inside the model on the GPU: bf16 teacher-forced logprobs close to transformers'
    fp32 ones; CUDA graphs (the routing and alignment are sync-free) give the eager greedy tokens."""
    prompt_ids = None
    outputs = {}
    for eager in (True, False):
        with LLM(str(moe_dirs[arch]), device="cuda", dtype="bfloat16", num_kvcache_blocks=256,
                 enforce_eager=eager) as llm:
            prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
            outputs[eager] = [o.token_ids for o in llm.generate(
                prompt_ids, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))]
            if eager:
                params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=TOP_N)
                for ids, (tokens, hf_logprobs) in zip(prompt_ids, hf_greedy(moe_dirs[arch], prompt_ids, 4)):
                    steps = llm.generate([ids + tokens[:step] for step in range(len(tokens))], params)
                    for output, hf_lp in zip(steps, hf_logprobs):
                        top = [t for t, _ in output.logprobs[0].top]
                        torch.testing.assert_close(torch.tensor([v for _, v in output.logprobs[0].top]),
                                                   hf_lp[top].float(), atol=0.05, rtol=0)
    assert outputs[False] == outputs[True]


def test_fp8_kv_cache_on_an_moe_model_stays_close(moe_dirs):
    """The FP8 cache changes attention only: the first token's top-5 logprobs stay close to the fp32 cache's."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=TOP_N)
    tops = []
    for kv_dtype in ("auto", "fp8_e4m3"):
        with LLM(str(moe_dirs["qwen3moe"]), kv_cache_dtype=kv_dtype, num_kvcache_blocks=64) as llm:
            outputs = llm.generate([llm.tokenizer.encode(p) for p in PROMPTS], params)
            tops.append([dict(o.logprobs[0].top) for o in outputs])
    for full, fp8 in zip(*tops):
        shared = set(full) & set(fp8)
        assert len(shared) >= 4
        for token in shared:
            assert abs(full[token] - fp8[token]) < 0.05


def test_the_moe_demo_is_a_qwen3_moe_that_transformers_reads_and_we_match(tmp_path, monkeypatch):
    """`--model demo-moe` (the image bakes it beside the demo): written by our own code, no transformers, in the
    Hugging Face layout; transformers loads it and produces our greedy tokens, with one process and with two."""
    from kubeinfer.runtime import demo
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(tmp_path / "models" / "demo"))
    folder = demo.resolve_model_dir("demo-moe")
    assert folder == tmp_path / "models" / "demo-moe"
    config = ModelConfig.from_dir(folder)
    assert config.architecture == "Qwen3MoeForCausalLM" and (config.moe.num_experts, config.moe.top_k) == (8, 2)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N)
    outputs = []
    for settings in ({}, {"expert_parallel_size": 2}):
        with LLM("demo-moe", max_num_batched_tokens=32, num_kvcache_blocks=64, **settings) as llm:
            prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
            outputs.append(llm.generate(prompt_ids, params))
    assert_same_outputs(outputs[0], hf_greedy(folder, prompt_ids, MAX_TOKENS), top_n=TOP_N)
    assert_same_outputs(outputs[1], outputs[0], top_n=TOP_N)
