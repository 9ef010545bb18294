"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) against transformers on the same random checkpoints:
greedy tokens and top-5 logprobs in fp32, in one mixed-length batch with chunked prefill; then the engine's other
paths (prefix-cache hits, preemption, speculative decoding) give the same tokens."""
import pytest
import torch

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.models.config import ModelConfig
from kubeinfer.runtime.sampling_params import SamplingParams
from support.reference import hf_greedy

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
    for output, (hf_tokens, hf_logprobs) in zip(ours, hf_greedy(moe_dirs[arch], prompt_ids, MAX_TOKENS)):
        assert output.token_ids == hf_tokens
        for ours_lp, hf_lp in zip(output.logprobs, hf_logprobs):
            hf_top = hf_lp.topk(TOP_N)
            assert [t for t, _ in ours_lp.top] == hf_top.indices.tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in ours_lp.top]), hf_top.values, atol=1e-4, rtol=0)


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


@pytest.mark.parametrize("arch", ["qwen2moe", "mixtral"])
def test_tp2_matches_tp1_on_real_processes(moe_dirs, arch):
    """Tensor parallelism over gloo: every rank holds every expert with half its intermediate size (Qwen2-MoE's
    shared expert too); the partial sums are all-reduced. Same greedy tokens and logprobs as one rank."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N)
    outputs = []
    for tp in (1, 2):
        with LLM(str(moe_dirs[arch]), tensor_parallel_size=tp, max_num_batched_tokens=32, num_kvcache_blocks=64) as llm:
            outputs.append(llm.generate([llm.tokenizer.encode(p) for p in PROMPTS], params))
    for one, two in zip(*outputs, strict=True):
        assert two.token_ids == one.token_ids
        for a, b in zip(one.logprobs, two.logprobs):
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            torch.testing.assert_close(torch.tensor([v for _, v in b.top]), torch.tensor([v for _, v in a.top]),
                                       atol=1e-4, rtol=0)
