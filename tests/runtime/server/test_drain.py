"""SIGTERM during streams: /ready turns 503, new requests are refused, the streams finish, exit 0."""
import os
import signal
import subprocess
import sys
import threading
import time

import httpx


def test_sigterm_drains_streams_then_exits_zero(llama_dir, tmp_path):
    from socket import socket
    with socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "kubeinfer.runtime.cli", "serve", "--model", str(llama_dir), "--host", "127.0.0.1",
         "--port", str(port), "--served-model-name", "tiny", "--max-num-seqs", "1", "--drain-timeout-seconds", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not become ready"
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        results, first_chunk = [None] * 3, threading.Event()

        def stream(i):
            body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": 300, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            lines = []
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    if line:
                        lines.append(line)
                        first_chunk.set()
            results[i] = lines

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        assert first_chunk.wait(30)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        ready = httpx.get(url + "/ready", timeout=5)
        refused = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "late", "max_tokens": 2}, timeout=5)
        for thread in threads:
            thread.join(60)
        code = process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read()
    assert ready.status_code == 503 and refused.status_code == 503, output
    assert refused.json()["error"]["code"] == "draining"
    for lines in results:
        assert lines[-1] == "data: [DONE]"
        assert '"completion_tokens": 300' in lines[-2]
    assert code == 0, output
    assert "drained" in output
