"""200 concurrent streams, a quarter cancelled mid-stream: the rest complete, no KV block leaks, and the
metrics agree with what the clients saw."""
import asyncio
import random
import time

import httpx
import openai
from support import scrape_metrics as scrape, metric_value, wait_for

MODEL = "tiny"


def value(samples, name, **labels) -> float:
    return metric_value(samples, name, model_name=MODEL, **labels)


def test_concurrent_streams_with_cancellations(llama_dir, start_server):
    rng = random.Random(5)
    plans = [{"prompt": " ".join(rng.choice(["pods", "nodes", "GPU", "cache", "token"]) for _ in range(rng.randint(1, 30))),
              "cancel_after": rng.randint(1, 5) if i % 4 == 0 else None,
              "max_tokens": 200 if i % 4 == 0 else rng.randint(4, 24)} for i in range(200)]

    async def one(client, plan):
        stream = await client.completions.create(model=MODEL, prompt=plan["prompt"], max_tokens=plan["max_tokens"],
                                                 temperature=0.8, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        chunks, text, usage, finish = 0, "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices:
                chunks += 1
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if plan["cancel_after"] is not None and chunks >= plan["cancel_after"]:
                await stream.close()   # the client goes away mid-stream
                return {"cancelled": True, "chunks": chunks}
        return {"cancelled": False, "usage": usage, "finish": finish, "text": text}

    async def main(url):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        results = await asyncio.gather(*(one(client, plan) for plan in plans))
        await client.close()
        return results

    with start_server(llama_dir, max_model_len=512) as (url, state):
        results = asyncio.run(main(url))
        # Every block back, as the engine process reports it: no running or waiting request, no block in use.
        samples = wait_for(lambda: (lambda s: s if value(s, "kubeinfer_kv_cache_usage_ratio") == 0
                                    and value(s, "kubeinfer_num_requests_running") == 0 else None)(scrape(url)),
                           10, "the engine to free every block")
        assert value(samples, "kubeinfer_num_requests_waiting") == 0
    completed = [r for r in results if not r["cancelled"]]
    cancelled = [r for r in results if r["cancelled"]]
    assert len(cancelled) == 50 and len(completed) == 150
    for plan, result in zip(plans, results):
        if not result["cancelled"]:
            assert result["finish"] == "length" and result["usage"].completion_tokens == plan["max_tokens"]
    tokenizer = state.tokenizer
    # A cancelled stream whose 200 tokens were all generated before its disconnect reached the engine (they wait in
    # the socket's buffers while the client reads its first few) ends as "length" there; none is lost either way.
    finished, aborted = (value(samples, "kubeinfer_request_success_total", finished_reason=reason)
                         for reason in ("length", "abort"))
    assert finished + aborted == 200 and aborted <= 50 and finished >= 150
    assert value(samples, "kubeinfer_time_to_first_token_seconds_count") == 200
    assert value(samples, "kubeinfer_e2e_request_latency_seconds_count") == 200
    assert value(samples, "kubeinfer_prompt_tokens_total") == sum(len(tokenizer.encode(p["prompt"])) for p in plans)
    delivered = sum(r["usage"].completion_tokens for r in completed)
    generated = value(samples, "kubeinfer_generation_tokens_total")
    assert delivered + sum(r["chunks"] for r in cancelled) <= generated <= delivered + 50 * 200
    assert value(samples, "kubeinfer_num_requests_running") == 0 and value(samples, "kubeinfer_kv_cache_usage_ratio") == 0
    assert not any(name == "kubeinfer_request_errors_total" for name, _ in samples)
