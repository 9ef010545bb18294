"""Disaggregated serving over HTTP, real processes on 127.0.0.1: `kubeinfer serve --kv-role prefill|decode` replicas
of the tiny Llama, the decode replica's `kubeinfer_kv_source` field, and `kubeinfer router --prefill-upstream`.

A prefill replica P and a decode replica D of the model served as "tiny" start together for the module; the tests
against another model (`-m slow`) start a third, a prefill replica Q of the same files served as "other" (another
model as the KV layout check sees it)."""
import http.server
import socket
import threading
import time

import httpx
import openai
import pytest

from support import RuntimeServer, free_port, metric_value, scrape_metrics, wait_for

MODEL = "tiny"
EXTRA = {"ignore_eos": True}
PROMPTS = ["Disaggregated serving splits prefill from decode, and this prompt spans a few KV blocks of the cache.",
           "A second prompt for the router: pods, services, deployments and the replicas that serve a model."]
SERVE = ("--max-model-len", "512", "--cpu-threads", "1", "--kv-idle-timeout", "3")   # a stalled pull ends in 3 s


class Replicas:
    def __init__(self, prefill: RuntimeServer, decode: RuntimeServer, prefill_kv: int):
        self.prefill, self.decode = prefill, decode
        self.prefill_source = f"127.0.0.1:{prefill_kv}"


def prefill_server(model_dir, log, served_model_name: str = MODEL) -> tuple[RuntimeServer, str]:
    port = free_port()
    return RuntimeServer(model_dir, log, *SERVE, "--kv-role", "prefill", "--kv-host", "127.0.0.1", "--kv-port",
                         str(port), served_model_name=served_model_name), f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def replicas(llama_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("disagg")
    prefill, source = prefill_server(llama_dir, logs / "prefill.log")
    servers = [prefill, RuntimeServer(llama_dir, logs / "decode.log", *SERVE, "--kv-role", "decode")]
    try:
        yield Replicas(*(server.wait_ready() for server in servers), int(source.rpartition(":")[2]))
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def other(llama_dir, tmp_path_factory):
    """(Q, its KV endpoint): a prefill replica of another model."""
    server, source = prefill_server(llama_dir, tmp_path_factory.mktemp("other") / "other.log", "other")
    try:
        yield server.wait_ready(), source
    finally:
        server.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def colocated(replicas: Replicas, prompt: str, max_tokens: int = 12) -> str:
    """The reference: an ordinary request (a prefill replica serves those too)."""
    result = client(replicas.prefill.url).completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                                             temperature=0, extra_body=EXTRA)
    return result.choices[0].text


def test_each_role_says_its_role(replicas):
    assert httpx.get(replicas.prefill.url + "/ready").json() == {"status": "ready", "kv_role": "prefill",
                                                                 "kv_port": int(replicas.prefill_source[10:])}
    assert httpx.get(replicas.decode.url + "/ready").json() == {"status": "ready", "kv_role": "decode"}
    samples = scrape_metrics(replicas.prefill.url)
    assert metric_value(samples, "kubeinfer_kv_role", model_name=MODEL, role="prefill",
                        kv_port=replicas.prefill_source[10:]) == 1
    assert metric_value(scrape_metrics(replicas.decode.url), "kubeinfer_kv_role", model_name=MODEL, role="decode",
                        kv_port="") == 1


def test_a_pulled_request_equals_a_colocated_one_streamed_or_not(replicas):
    decode = client(replicas.decode.url)
    source = {"kubeinfer_kv_source": replicas.prefill_source, **EXTRA}
    pulled = decode.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0, extra_body=source)
    chunks = list(decode.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}],
                                                 max_tokens=10, temperature=0, stream=True, extra_body=source))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    samples = scrape_metrics(replicas.decode.url)
    assert metric_value(samples, "kubeinfer_kv_transfer_requests_total", model_name=MODEL, role="decode",
                        outcome="completed") == 2
    assert metric_value(samples, "kubeinfer_kv_transfer_blocks_total", model_name=MODEL, kind="pulled") >= 4
    reference = client(replicas.prefill.url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=10, temperature=0, extra_body=EXTRA)
    assert pulled.choices[0].text == colocated(replicas, PROMPTS[0])
    assert streamed == reference.choices[0].message.content
    assert metric_value(scrape_metrics(replicas.prefill.url), "kubeinfer_kv_transfer_requests_total",
                        model_name=MODEL, role="prefill", outcome="completed") == 2


def assert_transfer_fails(replicas, source: str, why: str, stream: bool) -> None:
    with pytest.raises(openai.APIStatusError) as raised:
        result = client(replicas.decode.url).completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0, stream=stream,
            extra_body={"kubeinfer_kv_source": source})
        list(result) if stream else None
    assert raised.value.status_code == 502
    assert raised.value.body["code"] == "kv_transfer_failed" and why in raised.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_closed_kv_port_is_a_clean_502_before_the_response(replicas, stream):
    assert_transfer_fails(replicas, f"127.0.0.1:{free_port()}", "connection refused", stream)


def kv_idle(server: RuntimeServer, name: str = MODEL) -> bool:
    samples = scrape_metrics(server.url)
    return (metric_value(samples, "kubeinfer_kv_cache_usage_ratio", model_name=name) == 0
            and metric_value(samples, "kubeinfer_kv_transfer_in_flight", model_name=name) == 0)


def test_a_stalled_prefill_side_times_out_and_a_client_that_leaves_cancels_the_pull(replicas):
    with socket.create_server(("127.0.0.1", 0)) as silent:   # connections complete (the backlog); nothing answers
        source = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        assert_transfer_fails(replicas, source, "sent nothing for the idle timeout", stream=True)
        assert time.monotonic() - started < 15   # --kv-idle-timeout 3, on a busy box
        failed = failed_pulls(replicas.decode)
        body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, "stream": True, "kubeinfer_kv_source": source}
        with pytest.raises(httpx.ReadTimeout):   # the client leaves while the pull waits
            httpx.post(replicas.decode.url + "/v1/completions", json=body, timeout=1.0)
        wait_for(lambda: kv_idle(replicas.decode), 10, "the pull ended and its blocks freed")
        assert failed_pulls(replicas.decode) == failed   # cancelled, not timed out (a timeout counts as failed)


def failed_pulls(server: RuntimeServer) -> float:
    return metric_value(scrape_metrics(server.url), "kubeinfer_kv_transfer_requests_total", model_name=MODEL,
                        role="decode", outcome="failed")


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_a_prefill_replica_of_another_model_is_a_clean_502(replicas, other, stream):
    assert_transfer_fails(replicas, other[1], "another KV layout: model 'other' on prefill, 'tiny' on decode", stream)


@pytest.mark.parametrize("fields, why", [
    ({"kubeinfer_kv_source": "8.8.8.8:9100"}, "outside this replica's --kv-source-networks"),
    ({"kubeinfer_kv_source": "prefill:9100"}, "IP:PORT"),
    ({"kubeinfer_kv_source": "127.0.0.1:9100", "logprobs": 1}, "logprobs cannot be combined"),
    ({"kubeinfer_kv_source": "127.0.0.1:9100", "n": 2}, "one choice"),
])
def test_a_kv_source_is_refused_where_it_is_not_safe(replicas, fields, why):
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, **fields}
    answer = httpx.post(replicas.decode.url + "/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "kubeinfer_kv_source" and why in answer.json()["error"]["message"]
    # A replica without the decode role never pulls
    body["kubeinfer_kv_source"] = replicas.prefill_source
    answer = httpx.post(replicas.prefill.url + "/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400 and "--kv-role decode" in answer.json()["error"]["message"]


def test_the_router_serves_disaggregated_and_its_output_equals_colocated(replicas, start_router):
    router = start_router([replicas.decode.url], "--prefill-upstream", replicas.prefill.url).wait_up(1)
    wait_for(lambda: router.metric("kubeinfer_router_prefill_replicas_up") == 1, 30, "the prefill replica up")
    routed = client(router.url)
    prompt = PROMPTS[1] + " Routed."
    streamed = routed.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                         extra_body=EXTRA)
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == colocated(replicas, prompt)
    assert router.metric("kubeinfer_router_disaggregation_requests_total", path="disaggregated") == 1
    assert router.metric("kubeinfer_router_picks_total", replica=replicas.decode.url, reason="decode") == 1
    # Not eligible (logprobs): colocated on the decode pool
    routed.completions.create(model=MODEL, prompt=prompt, max_tokens=2, logprobs=1)
    assert router.metric("kubeinfer_router_disaggregation_requests_total", path="colocated") == 1


class StandInPrefill:
    """An HTTP server that says it is a prefill replica whose KV endpoint is `kv_port` (where nothing listens)."""

    def __init__(self, kv_port: int):
        text = (f'kubeinfer_num_requests_waiting{{model_name="tiny"}} 0\n'
                f'kubeinfer_kv_role{{model_name="tiny",role="prefill",kv_port="{kv_port}"}} 1\n').encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("content-length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("bad", ["closed_port", pytest.param("other_model", marks=pytest.mark.slow)])
def test_the_router_falls_back_to_colocated_when_the_transfer_fails(replicas, start_router, request, bad):
    stand_in = StandInPrefill(free_port()) if bad == "closed_port" else None
    prefill_url = stand_in.url if stand_in else request.getfixturevalue("other")[0].url
    router = start_router([replicas.decode.url], "--prefill-upstream", prefill_url).wait_up(1)
    try:
        wait_for(lambda: router.metric("kubeinfer_router_prefill_replicas_up") == 1, 30, "the prefill replica up")
        prompt = PROMPTS[0] + f" Fallback {bad}."
        chunks = client(router.url).completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                                       stream=True, extra_body=EXTRA)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == colocated(replicas, prompt)
        assert router.metric("kubeinfer_router_disaggregation_requests_total", path="fallback") == 1
        assert router.metric("kubeinfer_router_prefill_replicas_up") == 0   # held out of the pick for a while
    finally:
        if stand_in:
            stand_in.server.shutdown()


def test_the_router_drops_a_clients_kv_source_and_pulls_only_onto_decode_replicas(replicas, start_router):
    """The decode pool here is P, which has no decode role: served colocated there, never with a KV source (P would
    refuse one with a 400, so the client's must have been dropped)."""
    stand_in = StandInPrefill(free_port())
    try:
        router = start_router([replicas.prefill.url], "--prefill-upstream", stand_in.url).wait_up(1)
        wait_for(lambda: router.metric("kubeinfer_router_prefill_replicas_up") == 1, 30, "the prefill replica up")
        body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4,
                "kubeinfer_kv_source": f"127.0.0.1:{free_port()}"}
        answer = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert router.metric("kubeinfer_router_disaggregation_requests_total", path="colocated") == 1
        assert router.metric("kubeinfer_router_disaggregation_requests_total", path="fallback") == 0
    finally:
        stand_in.server.shutdown()


def test_no_kv_block_is_left_held_on_any_replica(replicas):
    """After every test above (pulled, failed, refused, fallen back), every replica's pool is free again."""
    for server in (replicas.prefill, replicas.decode):
        wait_for(lambda: kv_idle(server), 10, f"no KV block held on {server.url}")
    samples = scrape_metrics(replicas.decode.url)
    assert metric_value(samples, "kubeinfer_kv_transfer_requests_total", model_name=MODEL, role="decode",
                        outcome="failed") >= 4   # closed ports (two direct, one through the router), a stall
