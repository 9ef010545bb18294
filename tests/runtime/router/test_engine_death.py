"""A replica whose engine process dies (the API process lives on a moment, then exits): behind the router its
streams go on elsewhere and its non-streamed requests are answered elsewhere, as when the whole replica dies.
Found by the chaos suite (docs/e2e.md, "Chaos suite": the engine process killed inside a pod): before, those
requests ended with the replica's error event or its 503."""
import os
import signal
import threading
from pathlib import Path

import httpx

from kubeinfer.runtime.router.resume import StreamProgress
from support import wait_for

from support.router_streams import stream_events, stream_text, victim_beside

BODY = {"model": "tiny", "prompt": "Kubernetes", "temperature": 0, "ignore_eos": True}


def kill_engine(server) -> None:
    """SIGKILL to the engine: the server's child started by multiprocessing's spawn."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == server.proc.pid and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
                return
        except (OSError, IndexError, ValueError):
            continue   # a process that ended meanwhile
    raise AssertionError(f"no engine process under {server.proc.pid}")


def test_the_failed_event_of_a_dead_engine_is_not_relayed_and_ends_the_relay():
    events = [b": ki-id cmpl-1 1700000000\n\n", b': ki 5 17 42\ndata: {"text": "hello"}\n\n',
              b': ki-failed\ndata: {"error": {"message": "the engine failed"}}\n\n', b"data: [DONE]\n\n"]
    progress = StreamProgress()
    assert progress.feed(b"".join(events)) == b'data: {"text": "hello"}\n\n'
    assert "the engine failed" in progress.failed and progress.resumable
    assert progress.token_ids == [17, 42] and progress.text_chars == 5


def test_a_stream_whose_replicas_engine_dies_goes_on_on_another_replica_with_the_same_text(
        llama_dir, replicas, start_router, tmp_path):
    body = BODY | {"max_tokens": 300, "stream": True}
    expected, _ = stream_events(replicas[0].url, "/v1/completions", body)
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        events, replica = stream_events(router.url, "/v1/completions", body, victim, kill=kill_engine)
        assert replica == victim.url
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]), events[-3:]
        assert stream_text(events) == stream_text(expected)
        assert len({e["id"] for e in events[:-1]}) == 1
        assert router.metric("kubeinfer_router_resumes_total", outcome="resumed") == 1
        assert router.metric("kubeinfer_router_upstream_errors_total", kind="engine_dead") == 1
        assert victim.proc.wait(30) != 0   # the API process exits when its engine dies (Kubernetes restarts it)


def test_a_non_streamed_request_whose_replicas_engine_dies_is_answered_by_another_replica(
        llama_dir, replicas, start_router, tmp_path):
    body = BODY | {"max_tokens": 480}
    expected = httpx.post(replicas[0].url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    with victim_beside(replicas[0], llama_dir, start_router, tmp_path / "victim.log") as (victim, router):
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(
            response=httpx.post(router.url + "/v1/completions", json=body, timeout=60)))
        thread.start()
        wait_for(lambda: router.metric("kubeinfer_router_requests_in_flight", replica=victim.url) == 1, 30,
                 "the router to send the request to the victim")
        kill_engine(victim)
        thread.join(timeout=60)
        response = answer["response"]
        assert response.status_code == 200, response.text
        assert response.headers["x-kubeinfer-replica"] == replicas[0].url
        assert response.json()["choices"][0]["text"] == expected
        assert router.metric("kubeinfer_router_resumes_total", outcome="retried") == 1
