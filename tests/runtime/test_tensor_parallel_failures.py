"""A TP=2 engine in its own process, generating in a loop: killing a rank ends it quickly, never a hang."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import logging, os, sys, time
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams

    if __name__ == "__main__":
        logging.basicConfig(level=logging.WARNING)
        model, mode = sys.argv[1], sys.argv[2]
        llm = LLM(model, tensor_parallel_size=2, num_kvcache_blocks=64)
        params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
        llm.generate(["Kubernetes runs containers"], params)
        print("READY", os.getpid(), *llm.engine.model_runner.workers.pids, flush=True)
        if mode == "exit":       # no shutdown(): interpreter exit stops the worker
            sys.exit(0)
        if mode == "idle":       # between requests, as a server waits: only the watchdog can notice
            time.sleep(60)
            sys.exit(0)
        while True:
            llm.generate(["Kubernetes runs containers"] * 4, params)
""")
DEADLINE_S = 10.0


def _start(model_dir: Path, tmp_path: Path, mode: str) -> tuple[subprocess.Popen, int, int]:
    script = tmp_path / "tp_engine.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(model_dir), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        pytest.fail(f"the engine did not start: {line!r}\n{proc.stderr.read()}")
    _, rank0, rank1 = line.split()
    return proc, int(rank0), int(rank1)


def _gone(pid: int) -> bool:
    """True when `pid` has exited (a zombie left unreaped by a container's init counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, deadline_s: float) -> float:
    started = time.monotonic()
    while not _gone(pid):
        if time.monotonic() - started > deadline_s:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"process {pid} still alive after {deadline_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize("mode", ["loop", "idle"])
def test_killing_rank1_exits_the_engine_nonzero_with_a_clear_error(llama_dir, tmp_path, mode):
    proc, _, rank1 = _start(llama_dir, tmp_path, mode)
    time.sleep(0.5)   # in the generate loop, or idle
    killed = time.monotonic()
    os.kill(rank1, signal.SIGKILL)
    try:
        returncode = proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the engine hung for {DEADLINE_S} s after its rank 1 was killed")
    elapsed = time.monotonic() - killed
    stderr = proc.stderr.read()
    assert returncode == 1, stderr
    assert f"tensor-parallel rank 1 (pid {rank1}) was killed by SIGKILL" in stderr
    assert elapsed < 3.0, elapsed


def test_killing_rank0_stops_the_worker(llama_dir, tmp_path):
    proc, rank0, rank1 = _start(llama_dir, tmp_path, "loop")
    time.sleep(0.5)
    os.kill(rank0, signal.SIGKILL)
    proc.wait(timeout=DEADLINE_S)
    assert _wait_gone(rank1, DEADLINE_S) < 3.0


def test_interpreter_exit_stops_the_worker_cleanly(llama_dir, tmp_path):
    proc, _, rank1 = _start(llama_dir, tmp_path, "exit")
    assert proc.wait(timeout=DEADLINE_S) == 0, proc.stderr.read()
    assert _gone(rank1)
    assert "Traceback" not in proc.stderr.read()
