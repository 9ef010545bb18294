"""Structured output where the engine gets in the way: preemption (sequences recomputed when KV blocks run out) and
speculative decoding (drafts checked against the grammar). Greedy constrained output must equal the plain engine's
(offline, nothing preempted, no drafts), and sampled output must still validate."""
import json
import re

import httpx
import jsonschema
import openai

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.structured.formats import response_format_output

MODEL = "tiny"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "items"],
          "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                         "items": {"type": "array", "minItems": 2, "maxItems": 4, "items": {
                             "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
                             "properties": {"sku": {"enum": ["a1", "b2", "c3"]},
                                            "qty": {"type": "integer", "minimum": 1, "maximum": 9}}}}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA, "strict": True}}
PROMPTS = [f"order {i}: {{\"id\":1,\"items\":[{{\"sku\":\"a1\",\"qty\":2}},{{\"sku\":\"b2\",\"qty\":3}}]}}"
           for i in range(8)]


def metric(text: str, name: str) -> float:
    return float(re.search(rf'^{re.escape(name)}{{model_name="{MODEL}"}} (\S+)$', text, re.MULTILINE).group(1))


def offline_greedy(llama_dir) -> list[str]:
    structured = response_format_output(FORMAT, layout="compact")
    outputs = LLM(str(llama_dir), max_model_len=256).generate(
        PROMPTS, SamplingParams(max_tokens=120, temperature=0, structured=structured))
    assert all(o.finish_reason == "stop" for o in outputs)
    return [o.text for o in outputs]


def served(url: str, temperature: float) -> list[str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    result = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=120, temperature=temperature, seed=5,
                                       extra_body={"response_format": FORMAT})
    assert [c.finish_reason for c in result.choices] == ["stop"] * len(PROMPTS)
    texts = [c.text for c in sorted(result.choices, key=lambda c: c.index)]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    return texts


def test_preempted_constrained_sequences_resume_their_grammar(llama_dir, start_server):
    expected = offline_greedy(llama_dir)
    # 16 blocks of 16 tokens for 8 sequences of ~90 tokens each: the scheduler must preempt
    with start_server(llama_dir, max_model_len=256, num_kvcache_blocks=16, json_layout="compact") as (url, _):
        assert served(url, 0) == expected
        served(url, 1.0)
        preemptions = metric(httpx.get(url + "/metrics").text, "kubeinfer_num_preemptions_total")
    assert preemptions > 0


def test_drafts_are_checked_by_the_grammar(llama_dir, start_server):
    expected = offline_greedy(llama_dir)
    with start_server(llama_dir, max_model_len=256, speculative_method="ngram", speculative_ngram_min=1,
                      json_layout="compact") as (url, _):
        assert served(url, 0) == expected
        served(url, 1.0)
        text = httpx.get(url + "/metrics").text
    drafted = metric(text, "kubeinfer_spec_decode_num_draft_tokens_total")
    accepted = metric(text, "kubeinfer_spec_decode_num_accepted_tokens_total")
    assert drafted > accepted > 0   # drafts were proposed, some kept, and some refused
