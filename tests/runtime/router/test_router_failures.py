"""The router when replicas fail or are missing: errors, retries, waiting, scale from zero."""
import contextlib
import json
import signal
import threading
import time

import httpx
import pytest

from support import RuntimeServer, free_port, wait_for

BODY = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@contextlib.contextmanager
def victim_beside(replica, llama_dir, start_router, log):
    """A second replica (the victim) and a round-robin router over both that picks the victim first and scrapes
    so rarely that it learns what became of the victim only by trying it; yields (victim, router)."""
    victim = RuntimeServer(llama_dir, log, "--max-model-len", "512", "--cpu-threads", "1")
    try:
        victim.wait_ready()
        router = start_router([victim.url, replica.url], "--policy", "round-robin",
                              "--scrape-interval", "60", "--stale-after", "120").wait_up(2)
        yield victim, router
    finally:
        victim.stop()


def test_replica_killed_mid_stream_ends_with_an_error_and_refused_connections_go_elsewhere(
        llama_dir, replicas, start_router, tmp_path):
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        stream = BODY | {"max_tokens": 480, "stream": True}
        started = time.monotonic()
        with httpx.stream("POST", router.url + "/v1/completions", json=stream, timeout=30) as response:
            assert response.headers["x-kubeinfer-replica"] == victim.url
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            victim.proc.kill()
            rest = [line for line in lines if line.startswith("data: ")]
        assert time.monotonic() - started < 20
        error = json.loads(rest[-1][6:])["error"]
        assert error["type"] == "server_error" and error["code"] == "replica_failed"
        assert "data: [DONE]" not in rest
        # the next turn goes to the healthy replica, the one after to the dead one: refused, so retried
        for _ in range(2):
            response = httpx.post(router.url + "/v1/completions", json=BODY, timeout=30)
            assert response.status_code == 200, response.text
            assert response.headers["x-kubeinfer-replica"] == replicas[0].url
        assert router.metric("kubeinfer_router_upstream_errors_total", kind="connect") == 1
        assert router.metric("kubeinfer_router_upstream_errors_total", kind="disconnect") == 1


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
