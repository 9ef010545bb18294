"""Tensor parallelism through the HTTP server: TP=2 serves what TP=1 computes, and a dead rank stops it."""
import os
import signal
import time
from pathlib import Path

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support import RuntimeServer, spawned_children

PROMPTS = ["Kubernetes runs containers", "a", "The key and value cache keeps the attention state"]


def start(model_dir: Path, tmp_path: Path, tp: int) -> RuntimeServer:
    return RuntimeServer(model_dir, tmp_path / f"serve-tp{tp}.log", "--tensor-parallel-size", str(tp),
                         cache=tmp_path).wait_ready(90)


def worker_pids(server_pid: int) -> list[int]:
    """The tensor-parallel worker processes: children of the engine process, itself the server's child."""
    [engine] = spawned_children(server_pid)
    return spawned_children(engine)


def test_tp2_server_matches_tp1_engine(model_dirs, tmp_path):
    model_dir = model_dirs["llama3"]   # one KV head, replicated on both ranks; vocabulary not divisible by 2
    with LLM(str(model_dir)) as llm:
        expected = [o.text for o in llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0,
                                                                        ignore_eos=True))]
    server = start(model_dir, tmp_path, tp=2)
    try:
        assert len(worker_pids(server.proc.pid)) == 1
        for prompt, text in zip(PROMPTS, expected):
            assert server.complete(prompt, 12).json()["choices"][0]["text"] == text
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_killed_rank_stops_the_server_nonzero_within_seconds(model_dirs, tmp_path):
    server = start(model_dirs["qwen2"], tmp_path, tp=2)
    try:
        [worker] = worker_pids(server.proc.pid)
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        code = server.proc.wait(15)
        elapsed = time.monotonic() - killed
    finally:
        server.stop()
    output = server.output()
    assert code != 0 and elapsed < 10, output
    assert "rank 1" in output and "SIGKILL" in output


def test_killed_engine_process_ends_open_streams_and_stops_the_server_nonzero(model_dirs, tmp_path):
    """The engine process dies (OOM killer, a crash) mid-stream: the open stream ends with an error event,
    never a hang, and the server says so and exits 1 at once (Kubernetes restarts it)."""
    import json
    import threading

    import httpx
    server = RuntimeServer(model_dirs["qwen2"], tmp_path / "serve.log", "--max-model-len", "512",
                           cache=tmp_path).wait_ready(90)
    events: list[dict] = []
    first = threading.Event()

    def stream() -> None:
        body = {"model": "tiny", "prompt": "a", "max_tokens": 500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
                    first.set()
    reader = threading.Thread(target=stream)
    try:
        reader.start()
        assert first.wait(30), "no token before the kill"
        [engine] = spawned_children(server.proc.pid)
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        code = server.proc.wait(15)
        elapsed = time.monotonic() - killed
        reader.join(15)
    finally:
        server.stop()
    output = server.output()
    assert code == 1 and elapsed < 10, output
    assert "the engine process exited (exit code -9)" in output and "Traceback" not in output
    assert not reader.is_alive(), "the stream hung"
    assert "error" in events[-1] and "engine" in events[-1]["error"]["message"], events[-1]
