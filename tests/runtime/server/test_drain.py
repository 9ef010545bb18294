"""SIGTERM during streams: /ready turns 503, new requests are refused, the streams finish, exit 0."""
import signal
import threading

import httpx

from support import RuntimeServer, spawned_children, wait_for


def requests(server: RuntimeServer) -> tuple[float, float]:
    """(held: running + waiting, finished), from the server's own gauges and counter."""
    held = finished = 0.0
    for line in httpx.get(server.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(("kubeinfer_num_requests_running{", "kubeinfer_num_requests_waiting{")):
            held += float(line.rsplit(" ", 1)[1])
        elif line.startswith("kubeinfer_request_success_total{"):
            finished += float(line.rsplit(" ", 1)[1])
    return held, finished


def all_sent_and_one_waiting(server: RuntimeServer) -> bool:
    """All three requests taken, and at least one still waiting behind the running one (the SIGTERM must find a
    whole request to drain). On a busy box the first stream can finish before the third is sent, so three held at
    once is not asked for."""
    held, finished = requests(server)
    return held >= 2 and held + finished == 3


def draining(server: RuntimeServer) -> httpx.Response | None:
    """/ready's answer once it is a 503 (the SIGTERM seen), else None."""
    ready = httpx.get(server.url + "/ready", timeout=5)
    return ready if ready.status_code == 503 else None


def test_sigterm_drains_streams_then_exits_zero(llama_dir, tmp_path):
    server = RuntimeServer(llama_dir, tmp_path / "serve.log", "--max-num-seqs", "1", "--drain-timeout-seconds", "60",
                           cache=tmp_path)
    try:
        server.wait_ready(60)
        results, first_chunk = [None] * 3, threading.Event()

        def stream(i):
            body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": 120, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            lines = []
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    if line:
                        lines.append(line)
                        first_chunk.set()
            results[i] = lines

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        assert first_chunk.wait(30)
        wait_for(lambda: all_sent_and_one_waiting(server), 30, "all three requests taken, one waiting")
        server.proc.send_signal(signal.SIGTERM)
        ready = wait_for(lambda: draining(server), 30, "/ready to turn 503 on SIGTERM", 0.01)
        refused = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "late", "max_tokens": 2},
                             timeout=5)
        for thread in threads:
            thread.join(60)
        code = server.proc.wait(60)
    finally:
        server.stop()
    output = server.output()
    assert ready.status_code == 503 and refused.status_code == 503, output
    assert refused.json()["error"]["code"] == "draining"
    for lines in results:   # each of the three streams ran to its end
        assert lines[-1] == "data: [DONE]"
        assert '"completion_tokens": 120' in lines[-2]
    assert code == 0, output
    assert "drained" in output


def test_sigterm_while_the_model_loads_stops_start_up_and_the_engine_process(llama_dir, tmp_path):
    """A pod deleted while it starts: SIGTERM before the server listens ends start-up at once, exit 0, and the
    engine process (which ignores SIGTERM itself) is gone too. Without a handler a container's PID 1 ignores
    the signal, and the pod ran until the SIGKILL at the end of its grace period."""
    from pathlib import Path
    server = RuntimeServer(llama_dir, tmp_path / "serve.log", cache=tmp_path)
    try:
        engine = wait_for(lambda: spawned_children(server.proc.pid), 60, "the engine process spawned", 0.01)
        assert not server.is_ready()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(20)
        output = server.output()
        assert code == 0, output
        assert "SIGTERM while starting: stopped before serving" in output and "ready in" not in output
        for pid in engine:   # gone (or a zombie of a parent that has exited: reaped by init)
            stat = Path(f"/proc/{pid}/stat")
            assert not stat.exists() or stat.read_text().split()[2] == "Z", f"engine process {pid} still runs"
    finally:
        server.stop()
