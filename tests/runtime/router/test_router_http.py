"""`kubeinfer router` in front of two real replicas, with the official openai client as the reference client."""
import json
import signal
import socket
import threading

import httpx
import openai
import pytest

from support import metric_value, scrape_metrics, wait_for

SYSTEMS = [f"System prompt number {i}: you answer questions about Kubernetes clusters, pods and GPUs. " * 2
           for i in range(6)]   # each about 190 characters: two full 64-character chunks and more


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def complete(url: str, prompt: str, max_tokens: int = 4, **fields) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json=body | fields, timeout=60)


def test_completions_and_streamed_chat_through_the_router_equal_direct(replicas, start_router):
    router = start_router([r.url for r in replicas]).wait_up(2)
    direct, routed = client(replicas[0].url), client(router.url)
    ask = dict(model="tiny", prompt="Kubernetes schedules pods", max_tokens=12, temperature=0)
    assert routed.completions.create(**ask).choices[0].text == direct.completions.create(**ask).choices[0].text
    chat = dict(model="tiny", messages=[{"role": "user", "content": "What is a pod?"}], max_tokens=12, temperature=0)
    direct_text = direct.chat.completions.create(**chat).choices[0].message.content
    chunks = list(routed.chat.completions.create(**chat, stream=True))
    assert len(chunks) > 3   # passed through chunk by chunk, not as one body
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct_text
    assert [m.id for m in routed.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as refused:   # a replica's own error passes through unchanged
        routed.completions.create(model="nope", prompt="x", max_tokens=1)
    assert refused.value.body["code"] == "model_not_found"
    # curl sends `Expect: 100-continue` with larger bodies: the router answers it; the replica never sees it
    body = {**ask, "prompt": "Kubernetes schedules pods " * 20}
    expecting = httpx.post(router.url + "/v1/completions", json=body, headers={"Expect": "100-continue"}, timeout=60)
    assert expecting.status_code == 200
    assert expecting.json()["choices"][0]["text"] == httpx.post(replicas[0].url + "/v1/completions", json=body,
                                                                timeout=60).json()["choices"][0]["text"]


def test_responses_structured_output_and_tool_calls_through_the_router_equal_direct(replicas, start_router):
    """What issue #27 asks of the API, through the router: responses.create and .stream, chat.completions.parse
    with a pydantic model, a required tool call whose arguments validate; each as the replica answers it."""
    import jsonschema
    from pydantic import BaseModel, Field

    class Pod(BaseModel):
        name: str = Field(max_length=8)
        restarts: int = Field(ge=0, le=9)

    router = start_router([r.url for r in replicas]).wait_up(2)
    direct, routed = client(replicas[0].url), client(router.url)
    ask = dict(model="tiny", input="What is a pod?", instructions="Answer briefly.", max_output_tokens=12,
               temperature=0)
    text = direct.responses.create(**ask).output_text
    assert routed.responses.create(**ask).output_text == text
    events = list(routed.responses.create(**ask, stream=True))   # cut by max_output_tokens: response.incomplete
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    messages = [{"role": "user", "content": "a pod"}]
    # max_tokens leaves room for the bounded whitespace random weights spend in every gap (docs/server.md)
    parsed = routed.chat.completions.parse(model="tiny", messages=messages, response_format=Pod, max_tokens=200,
                                           temperature=0).choices[0].message.parsed
    assert isinstance(parsed, Pod)
    assert parsed == direct.chat.completions.parse(model="tiny", messages=messages, response_format=Pod,
                                                   max_tokens=200, temperature=0).choices[0].message.parsed
    schema = {"type": "object", "additionalProperties": False, "required": ["namespace"],
              "properties": {"namespace": {"type": "string", "maxLength": 8}}}
    tools = [{"type": "function", "function": {"name": "list_pods", "parameters": schema}}]
    [call] = routed.chat.completions.create(model="tiny", messages=messages, tools=tools, tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=400,
                                            temperature=0).choices[0].message.tool_calls
    assert call.function.name == "list_pods"
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_responses_continuation_goes_to_the_replica_that_stored_it(replicas, start_router):
    """Each replica's response store is its own: four conversations started through the router, each continued
    twice by previous_response_id (streamed once), all answered; every continuation on its first turn's replica.

    Each first turn has its own long instructions, so the prefix footprint (not the rendezvous hash of replica
    URLs on random ports, which puts four short prompts on one replica 1 time in 8) sends the second new prefix
    to the other replica; scrapes never read as stale (a busy box may delay one past a second)."""
    router = start_router([r.url for r in replicas], "--stale-after", "3600").wait_up(2)
    routed = client(router.url)
    served_by = {}
    for system, topic in zip(SYSTEMS[:4], ("pods", "nodes", "GPUs", "queues"), strict=True):
        ask = dict(model="tiny", max_output_tokens=4, temperature=0)
        first = routed.responses.with_raw_response.create(instructions=system, input=f"Tell me about {topic}", **ask)
        served_by[topic] = {first.headers["x-kubeinfer-replica"]}
        previous = first.parse().id
        second = routed.responses.with_raw_response.create(input="And more?", previous_response_id=previous, **ask)
        served_by[topic].add(second.headers["x-kubeinfer-replica"])
        with routed.responses.with_streaming_response.create(input="Again?", previous_response_id=second.parse().id,
                                                            stream=True, **ask) as third:
            assert third.status_code == 200
            served_by[topic].add(third.headers["x-kubeinfer-replica"])
            third.read()
    assert all(len(urls) == 1 for urls in served_by.values()), served_by
    assert len(set().union(*served_by.values())) == 2   # the first turns spread: both replicas held some
    picks = sum(value for (name, labels), value in scrape_metrics(router.url).items()
                if name == "kubeinfer_router_picks_total" and dict(labels).get("reason") == "response")
    assert picks == 8


def test_same_prefix_goes_to_the_same_replica_and_prefixes_spread(replicas, start_router):
    router = start_router([r.url for r in replicas]).wait_up(2)
    served: dict[int, set[str]] = {}
    for turn in range(3):
        for i, system in enumerate(SYSTEMS):
            response = complete(router.url, system + f" User {turn} asks question {i}.")
            assert response.status_code == 200, response.text
            served.setdefault(i, set()).add(response.headers["x-kubeinfer-replica"])
    assert all(len(urls) == 1 for urls in served.values()), served
    assert set.union(*served.values()) == {r.url for r in replicas}
    picks = scrape_metrics(router.url)
    assert sum(v for (name, labels), v in picks.items()
               if name == "kubeinfer_router_picks_total" and ("reason", "prefix") in labels) == 12


def test_one_hot_prefix_is_spread_within_the_load_bound(replicas, start_router):
    router = start_router([r.url for r in replicas], "--load-bound-epsilon", "0.25").wait_up(2)
    num_streams, opened, served = 8, threading.Barrier(8, timeout=30), []
    body = {"model": "tiny", "prompt": SYSTEMS[0] + " the same hot question", "max_tokens": 300, "stream": True,
            "ignore_eos": True, "temperature": 0}

    def stream():
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60) as response:
            served.append(response.headers["x-kubeinfer-replica"])
            opened.wait()   # every stream is open (in flight) before any is read to its end
            for _ in response.iter_lines():
                pass

    threads = [threading.Thread(target=stream) for _ in range(num_streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    counts = [served.count(r.url) for r in replicas]
    assert sum(counts) == num_streams
    assert max(counts) <= 5, counts   # ceil(1.25 x 8 / 2)
    assert router.metric("kubeinfer_router_requests_in_flight", replica=replicas[0].url) == 0


def _finished(replica_url: str) -> dict[str, float]:
    """The replica's finished requests of model "tiny", by finish reason."""
    samples = scrape_metrics(replica_url)
    return {reason: metric_value(samples, "kubeinfer_request_success_total", model_name="tiny",
                                 finished_reason=reason) for reason in ("abort", "length")}


def _await_abort(replica_url: str, before: dict[str, float], what: str) -> None:
    """Waits until the replica ends the request: it must be by abort. The request would end by itself (480
    tokens: "length") if the disconnect never reached the replica, so no wall-clock guess decides the test."""
    ended = wait_for(lambda: (now := _finished(replica_url)) != before and now, 120, f"the replica to end {what}")
    assert ended == {**before, "abort": before["abort"] + 1}, f"{what} was not aborted: {before} -> {ended}"


def test_client_disconnect_aborts_the_request_on_the_replica(replicas, start_router):
    router = start_router([replicas[0].url]).wait_up(1)
    replica = replicas[0]
    running = lambda: metric_value(scrape_metrics(replica.url), "kubeinfer_num_requests_running",   # noqa: E731
                                   model_name="tiny")
    before = _finished(replica.url)
    body = {"model": "tiny", "prompt": "a long answer please", "max_tokens": 480, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))
    _await_abort(replica.url, before, "the streamed request")
    # Not streamed: the client gives up while the replica generates, i.e. once the replica runs the request.
    before = _finished(replica.url)
    body = json.dumps({"model": "tiny", "prompt": "another long one", "max_tokens": 480, "ignore_eos": True})
    port = int(router.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                           f"content-length: {len(body)}\r\n\r\n{body}".encode())
        wait_for(lambda: running() == 1 or _finished(replica.url) != before, 120, "the replica to start the request")
    _await_abort(replica.url, before, "the non-streamed request")
    wait_for(lambda: running() == 0, 120, "nothing running on the replica")
    wait_for(lambda: router.metric("kubeinfer_router_requests_in_flight", replica=replica.url) == 0, 120,
             "the router to count the request as ended")


def test_sigterm_lets_open_streams_finish_then_the_router_exits(replicas, start_router):
    router = start_router([replicas[0].url]).wait_up(1)
    body = {"model": "tiny", "prompt": "drain", "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        router.proc.send_signal(signal.SIGTERM)
        data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert json.loads(data[-2][6:])["choices"][0]["finish_reason"] == "length"   # all 200 tokens came
    assert router.proc.wait(timeout=30) == 0   # drained: a clean exit, not "killed by SIGTERM"
