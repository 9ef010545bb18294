"""Our modules vs transformers on the same random checkpoints: greedy tokens and logprobs (fp32)."""
import pytest
import torch

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.reference import hf_greedy

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]
PROMPTS = ["Kubernetes runs containers", "a", "The key and value cache keeps the attention state of every token",
           "Unicode: café, 日本語 🙂", "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000"]
MAX_TOKENS = 12
TOP_N = 5


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_and_logprobs_match_transformers(model_dirs, arch):
    llm = LLM(str(model_dirs[arch]), max_num_batched_tokens=64, num_kvcache_blocks=64)
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N)
    ours = llm.generate(prompt_ids, params)   # one batch, mixed lengths, chunked prefill
    reference = hf_greedy(model_dirs[arch], prompt_ids, MAX_TOKENS)
    for output, (hf_tokens, hf_logprobs) in zip(ours, reference):
        assert output.token_ids == hf_tokens
        assert len(output.logprobs) == MAX_TOKENS
        for step, (ours_lp, hf_lp) in enumerate(zip(output.logprobs, hf_logprobs)):
            assert ours_lp.token_id == hf_tokens[step]
            hf_top = hf_lp.topk(TOP_N)
            assert [t for t, _ in ours_lp.top] == hf_top.indices.tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in ours_lp.top]), hf_top.values,
                                       atol=1e-4, rtol=0)
            assert abs(ours_lp.logprob - hf_lp[ours_lp.token_id].item()) < 1e-4


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logprobs_close_to_fp32_reference(model_dirs, dtype):
    """In 16-bit our first-step distribution stays close to transformers' fp32 one."""
    llm = LLM(str(model_dirs["llama"]), dtype=dtype, num_kvcache_blocks=32)
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS[:3]]
    ours = llm.generate(prompt_ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logprobs=TOP_N))
    for output, (_, hf_logprobs) in zip(ours, hf_greedy(model_dirs["llama"], prompt_ids, MAX_TOKENS)):
        lp = output.logprobs[0]
        reference = hf_logprobs[0][[t for t, _ in lp.top]]
        torch.testing.assert_close(torch.tensor([v for _, v in lp.top]), reference, atol=0.05, rtol=0)
