"""`kubeinfer pool` (runtime/pool_launcher.py) on real processes: it starts one `kubeinfer serve` per model, one
after the other, all but the last asleep once started; a request to a sleeping model is answered (it wakes); an
engine that dies ends the pool with a non-zero exit and stops the others. Its flags, and each model's part of the
GPU. (Behind the router, and stopped by SIGTERM: tests/runtime/router/test_pool.py.)"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kubeinfer.runtime.cli_pool import parse_members
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.cli import build_parser
from kubeinfer.runtime.pool_launcher import PoolLauncher, sleep_level
from support import free_port_run, run_kubeinfer, wait_for

STOP_WITHIN = 30   # the engines' drain (nothing in flight) and exit


def engine_pids(launcher: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{launcher}/task").iterdir()
            for child in (task / "children").read_text().split()]


@pytest.fixture
def start_pool(model_dirs, tmp_path):
    started = []

    def start() -> tuple[subprocess.Popen, int]:
        port = free_port_run(2)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBEINFER_")}
        log = (tmp_path / f"pool{len(started)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "pool", "--member", f"first={model_dirs['llama']}",
             "--member", f"second={model_dirs['qwen2']}", "--host", "127.0.0.1", "--port", str(port), "--",
             "--max-model-len", "256", "--cpu-threads", "1"], env=environment, stdout=log, stderr=subprocess.STDOUT)
        started.append(proc)
        # the second starts only once the first is asleep: once it answers, both are up
        wait_for(lambda: proc.poll() is not None or sleep_level(port + 1) == 0, 120, "the pool's last model")
        assert proc.poll() is None, (tmp_path / f"pool{len(started) - 1}.log").read_text()[-3000:]
        return proc, port
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_all_but_the_last_start_asleep_and_an_engine_that_dies_ends_the_pool_non_zero(start_pool):
    """(SIGTERM, which stops every engine and exits 0: tests/runtime/router/test_pool.py.)"""
    launcher, port = start_pool()
    assert sleep_level(port) == 1 and sleep_level(port + 1) == 0
    first, second = engine_pids(launcher.pid)
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                        json={"model": "first", "prompt": "A pod is", "max_tokens": 4, "ignore_eos": True})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    assert sleep_level(port) == 0   # the request woke it (the router would have put the other to sleep first)
    os.kill(second, signal.SIGKILL)
    assert launcher.wait(STOP_WITHIN) != 0
    assert not Path(f"/proc/{first}").exists()   # stopped, and waited for, before the launcher exited


@pytest.mark.parametrize("args, message", [
    (["--member", "a"], "expected NAME=MODEL"),
    (["--member", "a=/x", "--member", "a=/y"], "given twice"),
    (["--member", "a=/x", "--max-awake", "0"], "--max-awake must be >= 1"),
    (["--member", "a=/x", "--", "--port", "9000"], "--port is set by `kubeinfer pool`"),
    (["--member", "a=/x", "--member", "b=/y", "--port", "65535"], "need ports up to 65536")])
def test_bad_pool_flags_are_one_line_errors(args, message):
    result = run_kubeinfer("pool", *args, timeout_s=60)
    assert result.returncode == 2 and message in result.stderr


def test_each_model_gets_its_part_of_the_gpu_share():
    members = {f"m{i}": "/x" for i in range(5)}
    launcher = PoolLauncher(members, 2, 1, "127.0.0.1", 8000, ["--gpu-memory-utilization", "0.8"])
    assert [launcher.gpu_share(i) for i in range(5)] == [0.4, 0.4, 0.4, 0.4, 0.8]
    commands = [launcher.command(i, name, "/x") for i, name in enumerate(members)]
    assert [c[c.index("--gpu-memory-utilization", c.index("0.8") + 1) + 1] for c in commands] == \
        ["0.4000"] * 4 + ["0.8000"]
    assert build_parser().parse_args(commands[0][3:]).gpu_memory_utilization == 0.4   # the last flag wins
    assert PoolLauncher(members, 1, 1, "h", 1, []).gpu_share(4) == 0.9


def test_parse_members_keeps_the_order():
    assert list(parse_members(["b=/1", "a=/2"])) == ["b", "a"]
    with pytest.raises(ConfigError):
        parse_members(["=/x"])
