"""Tensor parallelism through the HTTP server: TP=2 serves what TP=1 computes, and a dead rank stops it."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

PROMPTS = ["Kubernetes runs containers", "a", "The key and value cache keeps the attention state"]


def start(model_dir: Path, tmp_path: Path, tp: int):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "kubeinfer.runtime.cli", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
         "--port", str(port), "--served-model-name", "tiny", "--tensor-parallel-size", str(tp)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("the server did not become ready:\n" + process.stdout.read())
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)


def worker_pids(parent: int) -> list[int]:
    """The tensor-parallel worker processes of the server (spawned children, not the resource tracker)."""
    pids = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmdline:
                pids.append(int(child))
    return pids


def stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_tp2_server_matches_tp1_engine(model_dirs, tmp_path):
    model_dir = model_dirs["llama3"]   # one KV head, replicated on both ranks; vocabulary not divisible by 2
    with LLM(str(model_dir)) as llm:
        expected = [o.text for o in llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0,
                                                                        ignore_eos=True))]
    process, url = start(model_dir, tmp_path, tp=2)
    try:
        assert len(worker_pids(process.pid)) == 1
        for prompt, text in zip(PROMPTS, expected):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            assert httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"] == text
    finally:
        stop(process)
    assert process.returncode == 0


def test_killed_rank_stops_the_server_nonzero_within_seconds(model_dirs, tmp_path):
    process, url = start(model_dirs["qwen2"], tmp_path, tp=2)
    try:
        [worker] = worker_pids(process.pid)
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        code = process.wait(15)
        elapsed = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read()
    assert code != 0 and elapsed < 10, output
    assert "rank 1" in output and "SIGKILL" in output
