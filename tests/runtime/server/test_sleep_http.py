"""Sleep and wake over HTTP (docs/runtime.md, "Sleep"), with the official openai client for the requests: vLLM's
routes; a request that arrives while the engine sleeps wakes it and gets the answer it would have had awake; rounds
of concurrent streams with a sleep asked in the middle of each lose nothing; /metrics counts it all."""
import asyncio

import httpx
import openai
import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support import metric_value, scrape_metrics

PROMPTS = ["Kubernetes runs containers", "The key and value cache keeps", "Numbers: 0 1 2 3 4 5", "A pod is"]
TOKENS = 12
MODEL = {"model_name": "tiny"}


@pytest.fixture(scope="module")
def expected(llama_dir) -> dict[str, str]:
    llm = LLM(str(llama_dir))
    params = SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True)
    return {prompt: output.text for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params))}


def complete(client: openai.OpenAI, prompt: str) -> str:
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text


def test_a_request_wakes_the_engine_and_gets_the_same_answer(server, expected):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    before = scrape_metrics(url)
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False, "level": 0}
    for level in (1, 2):
        slept = httpx.post(f"{url}/sleep", params={"level": level}, timeout=60)
        assert slept.status_code == 200, slept.text
        assert slept.json()["is_sleeping"] and slept.json()["level"] == level
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True, "level": level}
        assert metric_value(scrape_metrics(url), "kubeinfer_engine_sleep_level", **MODEL) == level
        assert httpx.get(f"{url}/ready").status_code == 200, "a sleeping engine still takes requests: it wakes"
        assert complete(client, PROMPTS[0]) == expected[PROMPTS[0]]
        assert httpx.get(f"{url}/is_sleeping").json()["is_sleeping"] is False
    after = scrape_metrics(url)

    def grew(name, **labels):
        return metric_value(after, name, **MODEL, **labels) - metric_value(before, name, **MODEL, **labels)

    assert grew("kubeinfer_engine_sleeps_total") == 2
    assert grew("kubeinfer_engine_wakeups_total", cause="request") == 2
    assert grew("kubeinfer_requests_waited_for_wake_total") == 2
    assert grew("kubeinfer_engine_wake_seconds_count") == 2
    assert metric_value(after, "kubeinfer_engine_sleep_level", **MODEL) == 0


def test_wake_up_and_bad_levels(server, expected):
    url, _ = server
    assert httpx.post(f"{url}/wake_up").json()["woke_from_level"] == 0
    assert httpx.post(f"{url}/sleep", timeout=60).json()["level"] == 1   # vLLM's default level
    woke = httpx.post(f"{url}/wake_up", timeout=60).json()
    assert woke["woke_from_level"] == 1 and woke["is_sleeping"] is False
    for level in ("0", "3", "deep", ""):
        answer = httpx.post(f"{url}/sleep", params={"level": level})
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] == "level" and "level must be 1" in answer.json()["error"]["message"]
    assert httpx.get(f"{url}/is_sleeping").json()["is_sleeping"] is False
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    assert complete(client, PROMPTS[1]) == expected[PROMPTS[1]]


def test_no_stream_is_lost_across_sleeps_asked_while_streams_run(server, expected):
    """Six rounds of 16 concurrent streams, a sleep asked (level 1 and 2 in turn) once the first 8 stream and before
    the other 8 start: it waits for the streams in flight; a round either ends asleep (the next round's requests wake
    the engine) or its late streams woke it. Every stream ends whole, with the text it would have had awake."""
    url, _ = server
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    before = scrape_metrics(url)

    async def stream(prompt: str, started: asyncio.Event) -> str:
        chunks = await client.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        texts = []
        async for chunk in chunks:
            texts.append(chunk.choices[0].text)
            started.set()
        return "".join(texts)

    async def rounds():
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            for round_ in range(6):
                prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
                started = [asyncio.Event() for _ in prompts]
                tasks = [asyncio.create_task(stream(p, e)) for p, e in zip(prompts[:8], started)]
                await asyncio.gather(*(e.wait() for e in started[:8]))   # streaming: the sleep waits for them
                asleep = asyncio.create_task(http.post("/sleep", params={"level": 1 + round_ % 2}))
                tasks += [asyncio.create_task(stream(p, e)) for p, e in zip(prompts[8:], started[8:])]
                texts = await asyncio.gather(*tasks)
                assert texts == [expected[p] for p in prompts], f"round {round_}"
                assert (await asleep).status_code == 200
            await http.post("/wake_up")

    asyncio.run(rounds())
    after = scrape_metrics(url)
    assert metric_value(after, "kubeinfer_engine_sleeps_total", **MODEL) >= \
        metric_value(before, "kubeinfer_engine_sleeps_total", **MODEL) + 6
    request_wakes = (metric_value(after, "kubeinfer_engine_wakeups_total", **MODEL, cause="request")
                     - metric_value(before, "kubeinfer_engine_wakeups_total", **MODEL, cause="request"))
    assert request_wakes >= 5, "each round but the last ends asleep or was woken by a stream"
    assert metric_value(after, "kubeinfer_request_success_total", **MODEL, finished_reason="length") >= 96


def test_with_api_keys_only_a_key_may_put_the_engine_to_sleep(llama_dir, start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("good-key\n")
    with start_server(llama_dir, str(keys), max_model_len=256) as (url, _):
        for method, route in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            refused = httpx.request(method, url + route)
            assert refused.status_code == 401 and refused.json()["error"]["message"], route
        good = {"Authorization": "Bearer good-key"}
        assert httpx.post(url + "/sleep", headers=good, timeout=60).json()["is_sleeping"] is True
        assert httpx.get(url + "/is_sleeping", headers=good).json() == {"is_sleeping": True, "level": 1}
