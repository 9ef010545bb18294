"""The engine in its own process, and in a thread: same answers; a client that leaves a non-streaming request
aborts it (its blocks are freed at once, it counts as `abort`, not `length`)."""
import time
from pathlib import Path

import httpx
import openai
import pytest

from support import metric_value, scrape_metrics as scrape, spawned_children, wait_for

PROMPT = "Kubernetes runs containers"
EXTRA = {"ignore_eos": True}


def value(samples, name, **labels) -> float:
    return metric_value(samples, name, model_name="tiny", **labels)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_both_engine_modes_serve_the_offline_engine_answer(start_server, llama_dir, mode):
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    [expected] = LLM(str(llama_dir), max_model_len=256).generate(
        PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    with start_server(llama_dir, engine_mode=mode, max_model_len=256) as (url, state):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, extra_body=EXTRA)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stream=True, extra_body=EXTRA) if c.choices)
        assert whole.choices[0].text == streamed == expected.text
        assert state.engine.mode == mode and state.engine.is_alive


def test_a_client_that_leaves_a_non_streaming_request_aborts_it(start_server, llama_dir):
    with start_server(llama_dir, max_model_len=512) as (url, state):
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 480, "n": 8, "temperature": 0, "ignore_eos": True}
        started = time.monotonic()
        # Measured, not guessed: waits as long as the request takes (pytest-timeout bounds the test).
        assert httpx.post(url + "/v1/completions", json=body, timeout=None).status_code == 200
        whole = time.monotonic() - started   # the client leaves after a fifth of what the request takes
        before = scrape(url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=whole / 5)
        samples = wait_for(lambda: (lambda s: s if value(s, "kubeinfer_request_success_total",
                                                         finished_reason="abort") == 8 else None)(scrape(url)),
                           10, "the 8 choices to be aborted")
        assert value(samples, "kubeinfer_request_success_total", finished_reason="length") == 8   # the first request
        generated = (value(samples, "kubeinfer_generation_tokens_total")
                     - value(before, "kubeinfer_generation_tokens_total"))
        assert generated < 8 * 480   # stopped before the end (it used to run to the end, counted as length)
        wait_for(lambda: value(scrape(url), "kubeinfer_kv_cache_usage_ratio") == 0, 5, "every block freed")
        assert state.engine.num_in_flight == 0


def test_startup_phases_and_the_gateway_metric_names(llama_dir, tmp_path):
    """`kubeinfer serve` publishes its start-up phases (and logs them in one line) and keeps torch out of its
    API process (about a second of start-up and hundreds of MB); it exposes the gauges that
    llm-d's router and KServe read under vLLM's names, equal to ours; --no-vllm-metrics turns those off."""
    from support import RuntimeServer
    server = RuntimeServer(llama_dir, tmp_path / "serve.log", "--num-kvcache-blocks", "40", cache=tmp_path)
    plain = RuntimeServer(llama_dir, tmp_path / "plain.log", "--no-vllm-metrics", cache=tmp_path)   # started at once
    try:
        server.wait_ready()
        assert server.complete("hello", 8).status_code == 200
        samples = scrape(server.url)
        phases = {dict(labels)["phase"]: v for (name, labels), v in samples.items()
                  if name == "kubeinfer_startup_phase_seconds"}
        assert {"imports", "engine_spawn", "weights", "kv_cache", "ready"} <= set(phases)
        assert all(v >= 0 for v in phases.values()) and phases["ready"] > phases["imports"] > 0
        assert phases["ready"] >= sum(v for k, v in phases.items() if k != "ready") - 0.01
        assert "ready in" in server.output()
        if Path("/proc/self/maps").is_file():   # the API process never loads torch; the engine process does
            [engine] = spawned_children(server.proc.pid)
            assert "libtorch" not in Path(f"/proc/{server.proc.pid}/maps").read_text()
            assert "libtorch" in Path(f"/proc/{engine}/maps").read_text()
        for ours, theirs in (("kubeinfer_num_requests_running", "vllm:num_requests_running"),
                             ("kubeinfer_num_requests_waiting", "vllm:num_requests_waiting"),
                             ("kubeinfer_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc")):
            assert ((theirs, (("model_name", "tiny"),)) in samples) and value(samples, theirs) == value(samples, ours)
        assert value(samples, "vllm:cache_config_info", block_size="16", num_gpu_blocks="40") == 1
        assert not any(name.startswith("vllm:") for name, _ in scrape(plain.wait_ready().url))
    finally:
        server.stop()
        plain.stop()
