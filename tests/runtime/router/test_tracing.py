"""One trace per request across the router and a replica (runtime/tracing.py), received by a real OTLP/HTTP receiver
in the test (tests/support/otlp_receiver.py): the official openai client sends a `traceparent`; the router's spans
are its children, the replica's spans the children of the router's call to it, with the GenAI attributes."""
import os
import time

import httpx
import openai
import pytest

from support import RuntimeServer, free_port, wait_for
from support.otlp_receiver import OtlpReceiver
from support.router_streams import victim_beside

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
EXPORT_EVERY_MS = "50"   # the batch processor's delay: spans reach the receiver within it
SERVER, CLIENT = 2, 3    # OTLP's span kinds


def traceparent(trace_id: str = TRACE_ID) -> str:
    return f"00-{trace_id}-{CLIENT_SPAN}-01"


@pytest.fixture(scope="module")
def receiver():
    received = OtlpReceiver()
    yield received
    received.stop()


@pytest.fixture(scope="module")
def traced_replica(llama_dir, tmp_path_factory, receiver):
    """A replica that finds its collector in the standard variable (the router gets the flag)."""
    log = tmp_path_factory.mktemp("traced") / "replica.log"
    server = RuntimeServer(llama_dir, log, "--max-model-len", "512", "--cpu-threads", "1",
                           env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                                "OTEL_BSP_SCHEDULE_DELAY": EXPORT_EVERY_MS})
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture
def router(traced_replica, receiver, start_router, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", EXPORT_EVERY_MS)
    return start_router([traced_replica.url], "--otlp-traces-endpoint", receiver.url).wait_up(1)


def spans_named(receiver: OtlpReceiver, trace_id: str, names: set[str]) -> dict:
    """The trace's spans by name, once every name in `names` arrived."""
    def arrived():
        spans = {s.name: s for s in receiver.spans_of(trace_id)}
        return spans if names <= spans.keys() else None
    return wait_for(arrived, 30, f"spans {sorted(names)} of trace {trace_id}")


def test_a_streamed_chat_through_the_router_is_one_trace_with_each_stage(router, traced_replica, receiver):
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Where do pods run?"}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        extra_headers={"traceparent": traceparent()})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage.completion_tokens == 12
    route = "POST /v1/chat/completions"
    call = f"POST {traced_replica.url}"
    spans = spans_named(receiver, TRACE_ID, {route, "pick", call, "chat tiny", "queue", "prefill", "decode"})
    # The router's: the client's span is the parent; the pick and the call to the replica are its children.
    assert spans[route].service == "kubeinfer-router" and spans[route].kind == SERVER
    assert spans[route].parent_span_id == CLIENT_SPAN
    assert spans["pick"].parent_span_id == spans[route].span_id
    assert spans["pick"].attributes["kubeinfer.replica"] == traced_replica.url
    assert spans["pick"].attributes["kubeinfer.pick.reason"]
    assert spans[call].parent_span_id == spans[route].span_id and spans[call].kind == CLIENT
    assert spans[call].attributes["http.response.status_code"] == 200
    # The replica's: the child of the router's call; its stages its children, in order, within it.
    replica = spans["chat tiny"]
    assert replica.service == "kubeinfer-server" and replica.kind == SERVER
    assert replica.parent_span_id == spans[call].span_id
    replica_spans = [s for s in receiver.spans_of(TRACE_ID) if s.service == "kubeinfer-server"]
    assert {s.name for s in replica_spans} == {"chat tiny", "admission", "queue", "prefill", "decode"}
    assert all(s.parent_span_id == replica.span_id for s in replica_spans if s is not replica)
    queue, prefill, decode = spans["queue"], spans["prefill"], spans["decode"]
    assert replica.start_ns <= queue.start_ns <= queue.end_ns <= prefill.start_ns + 1_000
    assert prefill.end_ns <= decode.start_ns + 1_000 and decode.end_ns <= replica.end_ns
    assert spans[call].start_ns <= replica.start_ns and replica.end_ns <= spans[route].end_ns
    # GenAI attributes: what was asked, what was used, how long each stage took.
    attributes = replica.attributes
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.request.max_tokens"] == 12
    assert attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == 12
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert prefill.attributes["kubeinfer.prompt_tokens"] == usage.prompt_tokens
    assert decode.attributes["kubeinfer.output_tokens"] == 12
    seconds = {name: (spans[name].end_ns - spans[name].start_ns) / 1e9 for name in ("queue", "prefill", "decode")}
    assert attributes["gen_ai.latency.time_in_queue"] == pytest.approx(seconds["queue"], abs=1e-3)
    assert attributes["gen_ai.latency.time_in_model_prefill"] == pytest.approx(seconds["prefill"], abs=1e-3)
    assert attributes["gen_ai.latency.time_in_model_decode"] == pytest.approx(seconds["decode"], abs=1e-3)
    assert 0 < attributes["gen_ai.latency.time_to_first_token"] < attributes["gen_ai.latency.e2e"]
    assert not any("cancelled" in s.events for s in replica_spans)


def test_a_refused_request_ends_its_replica_span_with_the_error(router, receiver):
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4737"
    response = httpx.post(router.url + "/v1/chat/completions", timeout=60,
                          headers={"traceparent": traceparent(trace_id)},
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})
    assert response.status_code == 400
    spans = spans_named(receiver, trace_id, {"chat tiny", "POST /v1/chat/completions"})
    refused = spans["chat tiny"]
    assert refused.attributes["http.response.status_code"] == 400 and "refused" in refused.events
    assert refused.attributes["error.type"] == "InvalidRequestError"
    assert refused.status_code == 0   # a client's error is no server error (OpenTelemetry's HTTP conventions)
    assert "queue" not in {s.name for s in receiver.spans_of(trace_id)}   # it never reached the engine


def test_a_stream_the_client_leaves_ends_cancelled_with_what_it_had(router, traced_replica, receiver):
    trace_id = "6bf92f3577b34da6a3ce929d0e0e4738"
    body = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60,
                      headers={"traceparent": traceparent(trace_id)}) as response:
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break
    spans = spans_named(receiver, trace_id, {"text_completion tiny", "decode"})
    replica = spans["text_completion tiny"]
    assert "cancelled" in replica.events
    assert 0 < spans["decode"].attributes["kubeinfer.output_tokens"] < 400


def test_tracing_is_off_without_an_endpoint_and_a_bad_endpoint_is_a_start_up_error(monkeypatch):
    from kubeinfer.runtime import tracing
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.endpoint_from_environment() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert tracing.endpoint_from_environment() == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.endpoint_from_environment() is None
    assert tracing.traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert tracing.traces_url("https://c.example/otlp/v1/traces") == "https://c.example/otlp/v1/traces"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KUBEINFER_"))}
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "router", "--upstream",
                           "http://127.0.0.1:9", "--otlp-traces-endpoint", "collector:4318"],
                          env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "kubeinfer: error: the OTLP traces endpoint 'collector:4318' is not an http(s) URL" in done.stderr


def test_a_responses_api_request_is_traced_as_a_chat(router, receiver):
    trace_id = "7bf92f3577b34da6a3ce929d0e0e4739"
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused")
    response = client.responses.create(model="tiny", input="Name a node.", max_output_tokens=6, temperature=0,
                                       extra_headers={"traceparent": traceparent(trace_id)})
    spans = spans_named(receiver, trace_id, {"POST /v1/responses", "pick", "chat tiny", "decode"})
    replica = spans["chat tiny"]
    assert replica.attributes["http.route"] == "/v1/responses"
    assert replica.attributes["gen_ai.request.max_tokens"] == 6
    assert replica.attributes["gen_ai.usage.output_tokens"] == response.usage.output_tokens
    assert replica.parent_span_id == spans[f"POST {router_replica(spans)}"].span_id


@pytest.mark.parametrize("path, body, last_line", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a node."}], "max_tokens": 4},
     ("data: [DONE]",)),
    ("/v1/responses", {"input": "Name a node.", "max_output_tokens": 4},
     ('data: {"type": "response.completed"', 'data: {"type": "response.incomplete"'))])
def test_a_streamed_answer_ends_its_span_before_its_last_line_reaches_the_client(traced_replica, receiver, path, body,
                                                                                 last_line):
    """A client (the router) ends its own span once it has the last line: the replica's span must have ended by then,
    or the child outlives its parent in the trace (CI saw it by 0.1 ms)."""
    trace_id = "5bf92f3577b34da6a3ce929d0e0e473" + ("a" if "chat" in path else "b")
    request = {"model": "tiny", "temperature": 0, "stream": True, "ignore_eos": True, **body}
    lines = []
    with httpx.stream("POST", traced_replica.url + path, json=request, timeout=None,
                      headers={"traceparent": traceparent(trace_id)}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line:
                lines.append((line, time.time_ns()))   # each line as it arrives, before the body's end
    assert lines[-1][0].startswith(last_line)
    last_line_ns = lines[-1][1]
    replica = spans_named(receiver, trace_id, {"chat tiny"})["chat tiny"]
    assert replica.end_ns <= last_line_ns
    assert replica.events == []   # ended as answered, not as cancelled


def test_a_stream_resumed_on_another_replica_stays_one_trace(traced_replica, receiver, start_router, llama_dir,
                                                            tmp_path, monkeypatch):
    """The replica serving the stream is killed mid-stream: the router's span holds both attempts (the first says
    how it failed), and the replica that resumes it puts its spans under the second."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", EXPORT_EVERY_MS)
    trace_id = "9bf92f3577b34da6a3ce929d0e0e4741"
    body = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with victim_beside(traced_replica, llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        router.proc.kill()   # this test's router traces: started below with the flag, over the same two replicas
        router = start_router([victim.url, traced_replica.url], "--policy", "round-robin", "--scrape-interval", "60",
                              "--stale-after", "120", "--otlp-traces-endpoint", receiver.url).wait_up(2)
        events = []
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60,
                          headers={"traceparent": traceparent(trace_id)}) as response:
            assert response.headers["x-kubeinfer-replica"] == victim.url
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 3:
                        victim.proc.kill()
        assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    spans = spans_named(receiver, trace_id, {"POST /v1/completions", f"POST {victim.url}",
                                             f"POST {traced_replica.url}", "text_completion tiny", "decode"})
    route = spans["POST /v1/completions"]
    picks = [s for s in receiver.spans_of(trace_id) if s.name == "pick"]
    assert len(picks) == 2 and all(p.parent_span_id == route.span_id for p in picks)
    first, second = spans[f"POST {victim.url}"], spans[f"POST {traced_replica.url}"]
    assert first.parent_span_id == second.parent_span_id == route.span_id
    assert first.attributes["error.type"].startswith("failed mid-response") and "error.type" not in second.attributes
    assert spans["text_completion tiny"].parent_span_id == second.span_id
    assert route.status_code == 0


@pytest.fixture(scope="module")
def traced_pools(llama_dir, tmp_path_factory, receiver):
    """(prefill replica, decode replica), each tracing under its own service name."""
    logs = tmp_path_factory.mktemp("traced-disagg")
    serve = ("--max-model-len", "512", "--cpu-threads", "1")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": EXPORT_EVERY_MS}
    prefill = RuntimeServer(llama_dir, logs / "prefill.log", *serve, "--kv-role", "prefill", "--kv-host", "127.0.0.1",
                            "--kv-port", str(free_port()), env=env | {"OTEL_SERVICE_NAME": "prefill"})
    decode = RuntimeServer(llama_dir, logs / "decode.log", *serve, "--kv-role", "decode",
                           env=env | {"OTEL_SERVICE_NAME": "decode"})
    try:
        yield prefill.wait_ready(), decode.wait_ready()
    finally:
        prefill.stop()
        decode.stop()


def test_a_disaggregated_request_is_one_trace_over_three_processes(traced_pools, receiver, start_router,
                                                                    monkeypatch):
    prefill, decode = traced_pools
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", EXPORT_EVERY_MS)
    router = start_router([decode.url], "--prefill-upstream", prefill.url, "--otlp-traces-endpoint",
                          receiver.url).wait_up(1)
    wait_for(lambda: router.metric("kubeinfer_router_prefill_replicas_up") == 1, 30, "the prefill replica up")
    trace_id = "8bf92f3577b34da6a3ce929d0e0e4740"
    prompt = "Disaggregated serving splits prefill from decode, and this prompt spans a few KV blocks of the cache."
    answer = httpx.post(router.url + "/v1/completions", timeout=60, headers={"traceparent": traceparent(trace_id)},
                        json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                              "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    assert router.metric("kubeinfer_router_disaggregation_requests_total", path="disaggregated") == 1
    spans = spans_named(receiver, trace_id, {"POST /v1/completions", "text_completion tiny", "kv transfer",
                                             "decode", "kv export"})
    assert {s.service for s in receiver.spans_of(trace_id)} == {"kubeinfer-router", "decode", "prefill"}
    call = next(s for s in receiver.spans_of(trace_id) if s.name == f"POST {decode.url}")
    request = spans["text_completion tiny"]
    assert request.service == "decode" and request.parent_span_id == call.span_id
    assert spans["kv transfer"].parent_span_id == request.span_id   # the decode side's prefill: its pull
    export = spans["kv export"]
    assert export.service == "prefill" and export.parent_span_id == request.span_id and export.kind == SERVER
    assert export.attributes["kubeinfer.kv.blocks"] > 0
    on_prefill = [s for s in receiver.spans_of(trace_id) if s.service == "prefill"]
    assert {s.name for s in on_prefill} == {"kv export", "queue", "prefill"}
    assert all(s.parent_span_id == export.span_id for s in on_prefill if s is not export)
    # The pull runs inside the decode side's transfer span: it starts after, ends before the first token there.
    assert spans["kv transfer"].start_ns <= export.start_ns + 1_000_000
    assert export.end_ns <= spans["kv transfer"].end_ns + 1_000_000


def router_replica(spans: dict) -> str:
    """The replica the router's call went to, from its pick."""
    return spans["pick"].attributes["kubeinfer.replica"]
