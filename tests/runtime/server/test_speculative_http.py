"""Speculative decoding behind the HTTP API: the openai client streams plain greedy output, usage counts every
token, and /metrics reports the drafts and their acceptance under our names and vLLM's."""
import re

import httpx
import openai

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

MODEL = "tiny"
PROMPT = "spec spec spec decode decode decode spec spec spec decode decode decode spec spec"


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf'^{re.escape(name)}{{model_name="{MODEL}"{re.escape(labels)}}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name}{labels} is not in /metrics"
    return float(match.group(1))


def test_streamed_speculative_output_is_plain_greedy_output_and_is_measured(llama_dir, start_server):
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    [expected] = LLM(str(llama_dir), max_model_len=256).generate(PROMPT, params)
    with start_server(llama_dir, max_model_len=256, speculative_method="ngram", speculative_ngram_min=1) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for logprobs in (None, 0):   # 0: every token's logprob in the stream
            chunks = list(client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0, stream=True, logprobs=logprobs,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
            assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
            assert chunks[-1].usage.completion_tokens == 48
            if logprobs is not None:
                tokens = [t for c in chunks if c.choices for t in c.choices[0].logprobs.tokens]
                assert len(tokens) == 48
        text = httpx.get(url + "/metrics").text
    draft_tokens = metric(text, "kubeinfer_spec_decode_num_draft_tokens_total")
    accepted = metric(text, "kubeinfer_spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= draft_tokens
    per_position = [metric(text, "kubeinfer_spec_decode_num_accepted_tokens_per_pos_total", f',position="{p}"')
                    for p in range(4)]
    assert sum(per_position) == accepted and per_position == sorted(per_position, reverse=True)
    assert metric(text, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert metric(text, "vllm:spec_decode_num_drafts_total") == metric(text, "kubeinfer_spec_decode_num_drafts_total")
    assert metric(text, "kubeinfer_generation_tokens_total") == 2 * 48
    assert metric(text, "kubeinfer_inter_token_latency_seconds_count") == 2 * 47   # one per token after the first
