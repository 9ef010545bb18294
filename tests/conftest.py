"""The whole suite's settings for parallel runs: `make test` runs it over pytest-xdist, one worker per CPU (at most
four), each test file on one worker (`--dist loadfile`: its module fixtures are built once).

Each worker, and every process its tests start, gets an even share of the CPUs as OMP_NUM_THREADS (unless it is
set): two workers on two cores with two torch threads each wait at every parallel op's barrier for a thread the
other worker holds, measured 3x slower than one thread each (tests/runtime/test_trained_model.py and
test_moe_models.py, side by side: 203 s against 64 s)."""
import os
import sys

import pytest

from kubeinfer.runtime.cpu_threads import cpu_threads as cpus   # affinity and cgroup quota; imports no torch

MAX_WORKERS = 4   # each worker builds its own models and starts its own servers: more costs memory, not time


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(cpus(), MAX_WORKERS))


workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, cpus() // workers))   # read by torch when it is first imported
    if "torch" in sys.modules:   # a plugin imported it first
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
