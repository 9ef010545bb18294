"""The router when replicas fail or are missing: errors, retries, waiting, scale from zero."""
import contextlib
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from support import RuntimeServer, free_port, wait_for
from support.router_streams import stream_events, stream_text, victim_beside

BODY = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


def test_a_stream_whose_replica_is_killed_goes_on_on_another_replica_with_the_same_text(
        llama_dir, replicas, start_router, tmp_path):
    """Greedy completions: SIGKILL the replica after three events; the client's stream goes on, one id, the
    text of an uninterrupted run, [DONE] and no error; the next requests go to the healthy replica."""
    body = BODY | {"max_tokens": 300, "stream": True}
    expected, _ = stream_events(replicas[0].url, "/v1/completions", body)
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        events, replica = stream_events(router.url, "/v1/completions", body, victim)
        assert replica == victim.url and victim.proc.poll() is not None
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
        assert stream_text(events) == stream_text(expected) and len(stream_text(expected)) > 0
        assert len({e["id"] for e in events[:-1]}) == 1 and events[-2]["choices"][0]["finish_reason"] == "length"
        assert router.metric("kubeinfer_router_resumes_total", outcome="resumed") == 1
        assert router.metric("kubeinfer_router_upstream_errors_total", kind="disconnect") == 1
        for _ in range(2):   # the dead replica is out of the pick: nothing goes to it
            response = httpx.post(router.url + "/v1/completions", json=BODY, timeout=30)
            assert response.status_code == 200, response.text
            assert response.headers["x-kubeinfer-replica"] == replicas[0].url


def test_a_resumed_seeded_chat_stream_equals_an_uninterrupted_one_and_counts_usage_once(
        llama_dir, replicas, start_router, tmp_path):
    """Sampled (temperature 1, a seed) chat with a stop string and usage: the resumed stream has the role chunk
    once, the uninterrupted text, and one usage chunk counting the prompt and all the output once."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about pods and nodes"}],
            "max_tokens": 200, "temperature": 1.0, "seed": 7, "stream": True, "stop": ["zzzq"],
            "stream_options": {"include_usage": True}}
    expected, _ = stream_events(replicas[0].url, "/v1/chat/completions", body)
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        events, _ = stream_events(router.url, "/v1/chat/completions", body, victim, kill_after=5)
        assert victim.proc.poll() is not None and events[-1] == "[DONE]"
        assert stream_text(events) == stream_text(expected)
        roles = [c for e in events[:-1] for c in e["choices"] if "role" in c.get("delta", {})]
        assert len(roles) == 1
        usages = [e["usage"] for e in events[:-1] if e.get("usage")]
        assert len(usages) == 1 and usages[0]["completion_tokens"] == expected[-2]["usage"]["completion_tokens"]
        assert usages[0]["prompt_tokens"] == expected[-2]["usage"]["prompt_tokens"]
        assert router.metric("kubeinfer_router_resumes_total", outcome="resumed") == 1


def test_a_request_whose_replica_dies_before_answering_is_retried_elsewhere(
        llama_dir, replicas, start_router, tmp_path):
    """The victim is stopped (SIGSTOP: its socket still accepts), gets the request, and is killed: the router
    sends the request to the other replica, and the client gets the answer of an uninterrupted run."""
    body = BODY | {"max_tokens": 100}
    expected = httpx.post(replicas[0].url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        victim.proc.send_signal(signal.SIGSTOP)
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(
            response=httpx.post(router.url + "/v1/completions", json=body, timeout=60)))
        thread.start()
        wait_for(lambda: router.metric("kubeinfer_router_requests_in_flight", replica=victim.url) == 1, 30,
                 "the router to send the request to the victim")
        victim.proc.kill()
        thread.join(timeout=60)
        response = answer["response"]
        # Failed once in make test (a bare 500, 1 of ~5 runs; not reproduced in 9 more): the logs say why next time.
        assert response.status_code == 200, (f"{response.text}\nrouter log:\n{router.log.read_text()[-4000:]}\n"
                                             f"victim log:\n{(tmp_path / 'victim.log').read_text()[-2000:]}")
        assert response.headers["x-kubeinfer-replica"] == replicas[0].url
        assert response.json()["choices"][0]["text"] == expected
        # On a new connection: retried here. On a kept-alive one: the router's client tries it again on a new
        # connection first (a replica may close an idle one just as a request goes out), which is refused.
        assert (router.metric("kubeinfer_router_resumes_total", outcome="retried")
                + router.metric("kubeinfer_router_upstream_errors_total", kind="connect")) == 1


def test_a_stream_that_cannot_be_resumed_ends_with_an_error_event(llama_dir, replicas, start_router, tmp_path):
    """Two choices (not resumable), then one choice with no other replica left: an OpenAI-style error event,
    no [DONE], in bounded time."""
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        events, _ = stream_events(router.url, "/v1/completions", BODY | {"max_tokens": 480, "stream": True, "n": 2},
                                  victim)
        error = events[-1]["error"]
        assert error["type"] == "server_error" and error["code"] == "replica_failed"
        assert "[DONE]" not in events
    alone = RuntimeServer(llama_dir, tmp_path / "alone.log", "--max-model-len", "512", "--cpu-threads", "1")
    try:
        router = start_router([alone.wait_ready().url], "--queue-timeout", "1").wait_up(1)
        started = time.monotonic()
        events, _ = stream_events(router.url, "/v1/completions", BODY | {"max_tokens": 480, "stream": True}, alone)
        assert "no replica could resume" in events[-1]["error"]["message"] and "[DONE]" not in events
        assert time.monotonic() - started < 30
        assert router.metric("kubeinfer_router_resumes_total", outcome="failed") == 1
    finally:
        alone.stop()


def test_a_draining_replica_is_retried_elsewhere_and_finishes_what_it_holds(
        llama_dir, replicas, start_router, tmp_path):
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "draining.log") as (victim, router):
        stream = BODY | {"max_tokens": 480, "stream": True}
        with httpx.stream("POST", router.url + "/v1/completions", json=stream, timeout=60) as held:
            assert held.headers["x-kubeinfer-replica"] == victim.url
            lines = held.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            victim.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: not victim.is_ready(), 10, "the victim to start draining")
            # the next turn goes to the healthy replica; the one after to the draining one: 503, so retried
            for _ in range(2):
                response = httpx.post(router.url + "/v1/completions", json=BODY, timeout=30)
                assert response.status_code == 200, response.text
                assert response.headers["x-kubeinfer-replica"] == replicas[0].url
            assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
        assert router.metric("kubeinfer_router_upstream_errors_total", kind="draining") == 1
        assert victim.proc.wait(timeout=30) == 0


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


def test_without_a_replica_requests_wait_then_are_refused_with_retry_after(start_router):
    nowhere = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    router = start_router([nowhere], "--max-queued-requests", "1", "--queue-timeout", "1.5",
                          "--served-model-name", "tiny").wait_up(0)
    assert [m["id"] for m in httpx.get(router.url + "/v1/models").json()["data"]] == ["tiny"]
    results = {}

    def waiting_request():
        started = time.monotonic()
        results["first"] = httpx.post(router.url + "/v1/completions", json=BODY, timeout=30)
        results["waited"] = time.monotonic() - started

    thread = threading.Thread(target=waiting_request)
    thread.start()
    wait_for(lambda: router.metric("kubeinfer_router_queue_requests") == 1, 5, "the first request to wait")
    assert_openai_error(httpx.post(router.url + "/v1/completions", json=BODY, timeout=30), 429, "queue_full")
    thread.join(timeout=10)
    assert_openai_error(results["first"], 503, "no_replica")
    assert 1.4 <= results["waited"] < 5


def test_scale_from_zero_a_waiting_request_is_served_once_a_replica_is_up(llama_dir, start_router, tmp_path):
    port = free_port()
    router = start_router([f"http://127.0.0.1:{port}"], "--queue-timeout", "60").wait_up(0)
    results = {}
    thread = threading.Thread(target=lambda: results.update(
        response=httpx.post(router.url + "/v1/completions", json=BODY, timeout=90)))
    thread.start()
    wait_for(lambda: router.metric("kubeinfer_router_queue_requests") == 1, 5, "the request to wait")
    replica = RuntimeServer(llama_dir, tmp_path / "late.log", "--max-model-len", "512", "--port", str(port))
    try:
        thread.join(timeout=60)
        assert results["response"].status_code == 200, results["response"].text
        assert results["response"].json()["usage"]["completion_tokens"] == 4
        assert router.metric("kubeinfer_router_queue_requests") == 0
        assert router.metric("kubeinfer_router_queue_wait_seconds_count") == 1
    finally:
        replica.stop()


@pytest.mark.parametrize("args, message", [
    ([], "no replica: give at least one --upstream URL, or --service, or --endpoints-file"),
    (["--upstream", "http://a:1", "--service", "llama"], "give one of --upstream URLs, --service or --endpoints-file"),
    (["--service", "llama", "--endpoints-file", "/e"], "give one of --upstream URLs, --service or --endpoints-file"),
    (["--upstream", "localhost:8000"], "--upstream 'localhost:8000': expected http://HOST:PORT (no path)"),
    (["--upstream", "http://a:1", "--upstream", "http://a:1/"], "the same --upstream is given twice"),
    (["--upstream", "http://a:1", "--load-weight", "-1"], "load weight must be >= 0, got -1.0"),
    (["--upstream", "http://a:1", "--queue-timeout", "0"], "--queue-timeout must be > 0, got 0.0"),
])
def test_bad_router_flags_are_one_line_errors(args, message, capsys):
    from kubeinfer.runtime.cli import main
    with pytest.raises(SystemExit) as exited:
        main(["router", *args])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"kubeinfer: error: {message}\n"


def test_a_tenant_at_its_cap_gets_429_while_another_tenant_goes_through(replicas, start_router, tmp_path):
    """The router reads the replicas' keys file: tenant A may hold 2 requests open; its third is refused with
    429 `tenant_busy` and Retry-After, B's goes through, and A may send again once one of its own ended."""
    keys = tmp_path / "keys"
    keys.write_text("key-a tenant=a\nkey-b tenant=b\n")
    router = start_router([r.url for r in replicas], "--api-keys-file", str(keys),
                          "--max-in-flight-per-tenant", "2").wait_up(2)
    body = BODY | {"max_tokens": 480, "stream": True}

    def post(key: str, **fields) -> httpx.Response:
        return httpx.post(router.url + "/v1/completions", json=BODY | fields, timeout=60,
                          headers={"Authorization": f"Bearer {key}"})
    with contextlib.ExitStack() as streams:
        for _ in range(2):
            held = streams.enter_context(httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=60,
                                                      headers={"Authorization": "Bearer key-a"}))
            assert held.status_code == 200
        refused = post("key-a")
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "tenant_busy"
        assert int(refused.headers["retry-after"]) >= 1
        assert post("key-b").status_code == 200
    wait_for(lambda: sum(router.metric("kubeinfer_router_requests_in_flight", replica=r.url) for r in replicas) == 0,
             30, "the router to see both streams closed")   # (it counts a tenant out in the same step)
    assert post("key-a").status_code == 200   # room again
    assert router.metric("kubeinfer_router_refused_total", status_code="429") == 1


def test_from_zero_a_small_tenants_requests_leave_the_waiting_room_before_a_floods(llama_dir, start_router, tmp_path):
    """A queues 20 requests at the router while no replica is up, then B 2. The replica that comes up runs one
    sequence at a time in arrival order (fcfs): B's finish among the first, not behind A's 20
    (tests/runtime/router/test_waiting_room.py: the order itself)."""
    keys = tmp_path / "keys"
    keys.write_text("key-a tenant=a\nkey-b tenant=b\n")
    port = free_port()
    router = start_router([f"http://127.0.0.1:{port}"], "--api-keys-file", str(keys), "--queue-timeout", "120"
                          ).wait_up(0)
    finished: list[str] = []

    def post(key: str) -> int:
        status = httpx.post(router.url + "/v1/completions", json=BODY, timeout=150,
                            headers={"Authorization": f"Bearer {key}"}).status_code
        finished.append(key)
        return status
    with ThreadPoolExecutor(22) as pool:
        statuses = [pool.submit(post, "key-a") for _ in range(20)]
        wait_for(lambda: router.metric("kubeinfer_router_queue_requests") == 20, 10, "A's requests to wait")
        statuses += [pool.submit(post, "key-b") for _ in range(2)]
        wait_for(lambda: router.metric("kubeinfer_router_queue_requests") == 22, 10, "B's requests to wait")
        replica = RuntimeServer(llama_dir, tmp_path / "late.log", "--max-model-len", "512", "--port", str(port),
                                "--max-num-seqs", "1", "--api-keys-file", str(keys))
        try:
            assert [future.result() for future in statuses] == [200] * 22
        finally:
            replica.stop()
    assert sorted(finished) == ["key-a"] * 20 + ["key-b"] * 2
    assert max(i for i, key in enumerate(finished) if key == "key-b") < 6, finished   # arrival order: 20 and 21


def test_a_router_bug_is_an_openai_error_with_its_traceback_logged_not_a_bare_500(caplog):
    """Whatever escapes the proxy (here a forced bug) reaches the client as a 500 with an OpenAI error body naming
    it, the traceback goes to the router's log, and a response already started is not answered twice."""
    import asyncio
    import json

    from kubeinfer.runtime.router.app import Router
    from kubeinfer.runtime.router.settings import RouterSettings

    async def call(router, fail_after_start: bool) -> list[dict]:
        async def forward(scope, body, send, received_at, tenant, trace=None):
            if fail_after_start:
                await send({"type": "http.response.start", "status": 200, "headers": []})
            raise KeyError("a bug")
        router.proxy.forward = forward
        sent = []
        messages = iter([{"type": "http.request", "body": json.dumps(BODY).encode(), "more_body": False}])

        async def receive():
            try:
                return next(messages)
            except StopIteration:
                await asyncio.sleep(3600)   # the client stays

        async def send(message):
            sent.append(message)
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "client": ("127.0.0.1", 1)}
        try:
            await router(scope, receive, send)
        except KeyError:
            sent.append({"raised": True})
        return sent

    router = Router(RouterSettings(upstreams=["http://127.0.0.1:9"]))
    sent = asyncio.run(call(router, fail_after_start=False))
    assert sent[0]["status"] == 500
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "router_error" and "KeyError" in error["message"]
    assert "routing POST /v1/completions failed" in caplog.text and "Traceback" in caplog.text
    late = asyncio.run(call(Router(RouterSettings(upstreams=["http://127.0.0.1:9"])), fail_after_start=True))
    assert [m.get("status") for m in late if "status" in m] == [200] and late[-1] == {"raised": True}
