"""The official openai client, sync and async, streaming and not, against a real server."""
import asyncio

import openai
import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

MODEL = "tiny"
PROMPT = "Kubernetes runs containers"
EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline(llama_dir):
    return LLM(str(llama_dir), max_model_len=256)


def test_completion_matches_offline_engine_and_reports_usage(client, offline):
    [expected] = offline.generate(PROMPT, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    result = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=EXTRA)
    assert result.choices[0].text == expected.text
    assert result.choices[0].finish_reason == "length"
    assert result.usage.prompt_tokens == len(offline.tokenizer.encode(PROMPT))
    assert result.usage.completion_tokens == 12 and result.usage.total_tokens == result.usage.prompt_tokens + 12


def test_streamed_completion_equals_the_whole_one(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, extra_body=EXTRA)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=EXTRA))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # a stream whose prompt is in the prefix cache says so in its usage, as a whole answer does
    long_prompt = PROMPT * 5   # a few full KV blocks
    first = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=1, extra_body=EXTRA)
    streamed = list(client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=1, stream=True,
                                              stream_options={"include_usage": True}, extra_body=EXTRA))
    again = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=1, extra_body=EXTRA)
    cached = streamed[-1].usage.prompt_tokens_details.cached_tokens
    assert cached == again.usage.prompt_tokens_details.cached_tokens > 0, (cached, first.usage)


def test_chat_streamed_equals_whole_and_uses_the_template(client, offline):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is a pod?"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                           extra_body=EXTRA)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, extra_body=EXTRA)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    prompt = ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nWhat is a pod?<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert whole.usage.prompt_tokens == len(offline.tokenizer.encode(prompt, add_special_tokens=False))
    [expected] = offline.generate([offline.tokenizer.encode(prompt, add_special_tokens=False)],
                                  SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert whole.choices[0].message.content == expected.text


def test_async_client_streams_concurrently(server):
    url, _ = server

    async def main():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        whole = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                                                extra_body=EXTRA)

        async def streamed():
            stream = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                                                     stream=True, extra_body=EXTRA)
            return "".join([c.choices[0].text async for c in stream])

        texts = await asyncio.gather(*[streamed() for _ in range(8)])
        chat = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=5, temperature=0)
        await client.close()
        return whole.choices[0].text, texts, chat

    whole, texts, chat = asyncio.run(main())
    assert texts == [whole] * 8
    assert 1 <= chat.usage.completion_tokens <= 5 and chat.choices[0].message.role == "assistant"


def test_n_seed_stop_and_logprobs(client):
    result = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, n=3, seed=11, temperature=1.0,
                                       logprobs=3, extra_body=EXTRA)
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, n=3, seed=11, temperature=1.0,
                                      extra_body=EXTRA)
    assert [c.text for c in again.choices] == [c.text for c in result.choices]
    assert result.usage.completion_tokens == 24
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == 8 and all(len(top) == 3 for top in logprobs.top_logprobs)
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                       extra_body=EXTRA).choices[0].logprobs
    for token, logprob, top in zip(greedy.tokens, greedy.token_logprobs, greedy.top_logprobs):
        best = max(top, key=top.get)   # greedy: the sampled token is the most likely one
        assert (token, logprob) == (best, top[best])
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          logprobs=True, top_logprobs=2, temperature=0, extra_body=EXTRA)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(item.top_logprobs) == 2 for item in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, extra_body=EXTRA)
    stop = whole.choices[0].text[4:7]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop],
                                        extra_body=EXTRA)
    assert stopped.choices[0].text == whole.choices[0].text[:whole.choices[0].text.find(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_logit_bias_steers_sampling_as_openai_defines_it(client, offline):
    """+100 on one token makes it every greedy and sampled choice; -100 on the greedy text's tokens removes them."""
    token = offline.tokenizer.encode(" pod")[0]
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.8, seed=3,
                                       logit_bias={str(token): 100}, extra_body=EXTRA)
    assert forced.choices[0].text == offline.tokenizer.decode([token] * 6)
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, extra_body=EXTRA)
    [first] = offline.tokenizer.encode(PROMPT + greedy.choices[0].text)[-1:]
    banned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100}, extra_body=EXTRA)
    assert banned.choices[0].text != greedy.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          temperature=0, logit_bias={str(token): 100}, extra_body=EXTRA)
    assert chat.choices[0].message.content == offline.tokenizer.decode([token] * 3)


def test_models_and_probes(client, server):
    import httpx
    url, _ = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/ready").json() == {"status": "ready", "kv_role": "none"}
    metrics = httpx.get(url + "/metrics").text
    assert 'kubeinfer_generation_tokens_total{model_name="tiny"}' in metrics
    # what the router asks for: those families only, the same values
    from kubeinfer.runtime.router.replicas import SCRAPE_PATH, parse_gauges
    restricted = httpx.get(url + SCRAPE_PATH).text
    assert {line.split("{")[0] for line in restricted.splitlines() if not line.startswith("#")} == {
        "kubeinfer_num_requests_waiting", "kubeinfer_num_requests_running", "kubeinfer_kv_cache_usage_ratio",
        "kubeinfer_kv_role", "kubeinfer_engine_sleep_level"}
    assert parse_gauges(restricted) == parse_gauges(metrics) and parse_gauges(restricted)[1] == "tiny"


def test_text_offsets_count_characters_of_the_text(client, offline):
    """Completions logprobs' text_offset is the character offset of each token in the output text, also when a
    character spans several byte-level tokens (counted at its last one), streamed or not."""
    kwargs = dict(model=MODEL, prompt="Unicode: café, 日本語", max_tokens=48, temperature=1.0, seed=3, logprobs=1,
                  extra_body=EXTRA)
    whole = client.completions.create(**kwargs).choices[0]
    [expected] = offline.generate(kwargs["prompt"], SamplingParams(max_tokens=48, temperature=1.0, seed=3,
                                                                   ignore_eos=True))
    decode = offline.tokenizer.decode
    offsets = [len(decode(expected.token_ids[:i]).rstrip("\ufffd")) for i in range(len(expected.token_ids))]
    assert whole.text == expected.text and whole.logprobs.text_offset == offsets
    assert any(token.startswith("token_id:") for token in whole.logprobs.tokens), "no split character: pick a seed"
    assert offsets == sorted(offsets) and offsets[-1] <= len(whole.text)
    streamed = [o for chunk in client.completions.create(**kwargs, stream=True) if chunk.choices and
                chunk.choices[0].logprobs for o in chunk.choices[0].logprobs.text_offset]
    assert streamed == offsets
