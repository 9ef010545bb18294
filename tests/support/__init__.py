"""Real processes for tests, on 127.0.0.1: `kubeinfer serve` and Debian's Prometheus.

Importable from any test as `support` (pytest's `pythonpath` includes tests/).
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

PROMETHEUS_BIN = shutil.which("prometheus")


_handed_out: set[int] = set()
_port_choice = random.Random()   # its own generator: a test that seeds `random` does not repeat our ports


def free_port() -> int:
    """A loopback port nothing listens on now, below the kernel's ephemeral range.

    A server binds its port seconds after the test chose it (it loads a model first, and under tensor
    parallelism gloo opens dozens of sockets meanwhile). A port from bind(0) lies in the ephemeral range, where
    any of those outgoing connections may take it first (CI saw `address already in use` so); the kernel never
    hands out a port below that range by itself. Each port is handed out once per test process; under
    pytest-xdist each worker draws from its own slice of the range, so two workers never pick the same port.
    """
    start, stop = _port_slice()
    for _ in range(1000):
        port = _port_choice.randrange(start, stop)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {start}-{stop - 1}")


def _port_slice() -> tuple[int, int]:
    """The ports below the kernel's ephemeral range that this test process may hand out: 12,000 of them, or
    this pytest-xdist worker's share (gw0, gw1, ... of PYTEST_XDIST_WORKER_COUNT)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = max(1024, low - 12000)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = (low - start) // max(1, workers)
    return start + worker * share, start + (worker + 1) * share


def free_port_run(count: int) -> int:
    """The first of `count` consecutive free loopback ports (free_port's rules for each)."""
    for _ in range(100):
        first = free_port()
        if first + count > _port_slice()[1]:
            continue   # the run would reach into another worker's slice
        for port in range(first + 1, first + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    break
        else:
            _handed_out.update(range(first, first + count))
            return first
    raise RuntimeError(f"no {count} consecutive free loopback ports")


def spawned_children(parent: int) -> list[int]:
    """Processes `parent` started with multiprocessing's spawn (not its resource tracker)."""
    pids = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmdline:
                pids.append(int(child))
    return pids


def scrape_metrics(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a server's `/metrics`, keyed by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families
    samples = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric_value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Polls until `predicate()` is truthy; returns its value, or fails the test saying what never came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def stop_process(proc: subprocess.Popen, timeout_s: float = 15) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def run_kubeinfer(*args: str, cache: Path | None = None, env: dict[str, str] | None = None,
                  timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`kubeinfer ARGS` as a user runs it (from another folder), in an environment without KUBEINFER_*."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBEINFER_")}
    if cache is not None:
        environment["XDG_CACHE_HOME"] = str(cache)
    environment |= env or {}
    return subprocess.run([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", *args], env=environment,
                          capture_output=True, text=True, timeout=timeout_s, cwd=cache or None)


class RuntimeServer:
    """`kubeinfer serve` on a free loopback port, its output in `log`.

    The environment is the test's, less any `KUBEINFER_*` setting (except the log level), so a developer's
    environment cannot change what the server does; `cache` becomes its XDG_CACHE_HOME (the demo model).
    """

    def __init__(self, model: str | Path, log: Path, *args: str, cache: Path | None = None,
                 served_model_name: str = "tiny", env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith("KUBEINFER_") or k == "KUBEINFER_LOG_LEVEL"}
        if cache is not None:
            environment["XDG_CACHE_HOME"] = str(cache)
        environment |= env or {}
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubeinfer.runtime.cli", "serve", "--model", str(model), "--host", "127.0.0.1",
             "--port", str(self.port), "--served-model-name", served_model_name, *args],
            env=environment, stdout=self._log_file, stderr=subprocess.STDOUT)

    def is_ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float = 120) -> "RuntimeServer":
        wait_for(lambda: self.proc.poll() is not None or self.is_ready(), timeout_s, f"the runtime on {self.port}")
        assert self.proc.poll() is None, f"the runtime exited:\n{self.output()[-3000:]}"
        return self

    def complete(self, prompt: str, max_tokens: int, **fields) -> httpx.Response:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        return httpx.post(self.url + "/v1/completions", json=body | fields, timeout=60)

    def output(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text()

    def stop(self) -> None:
        stop_process(self.proc)
        self._log_file.close()


def static_targets(ports: list[int], namespace: str, service: str) -> list[dict]:
    """Scrape targets labelled as the operator's ServiceMonitor labels runtime pods."""
    return [{"targets": [f"127.0.0.1:{port}"],
             "labels": {"namespace": namespace, "service": service, "pod": f"{service}-{i}"}}
            for i, port in enumerate(ports)]


class Prometheus:
    """Debian's Prometheus on a free loopback port, scraping every second; skips the test when absent."""
    STALL_S = 120

    def __init__(self, workdir: Path, scrape_configs: list[dict], rule_files: list[Path] = ()):
        if PROMETHEUS_BIN is None:
            pytest.skip("prometheus binary not found (make test installs it: apt-get install -y prometheus)")
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(path) for path in rule_files], "scrape_configs": scrape_configs}
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(json.dumps(config))   # JSON is YAML
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [PROMETHEUS_BIN, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(self, expr: str) -> list[dict]:
        response = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=60)
        body = response.json()
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        """The single value `expr` returns, None when it returns nothing (or Prometheus is not up yet)."""
        try:
            result = self.query(expr)
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        return float(result[0]["value"][1]) if result else None

    def scrape_rounds(self) -> int:
        """Scrapes done of its least-scraped target: Prometheus's own clock (0 before its first scrape)."""
        return int(self.scalar("min(count_over_time(up[1h]))") or 0)

    def wait_for(self, predicate: Callable[[], Any], what: str, rounds: int) -> Any:
        """Polls until `predicate()` is truthy; fails once `rounds` more scrapes went by without it.

        The budget is counted in Prometheus's scrapes, not in seconds: a busy machine that slows the scrapes
        down gives the awaited thing as many chances. Only a Prometheus that stops scraping altogether (no
        new scrape in STALL_S, at a 1 s interval) fails on the clock."""
        start = last = self.scrape_rounds()
        progressed_at = time.monotonic()
        while True:
            value = predicate()
            if value:
                return value
            assert self.proc.poll() is None, f"Prometheus exited ({self.proc.returncode}) waiting for {what}"
            now = self.scrape_rounds()
            if now != last:
                last, progressed_at = now, time.monotonic()
            assert now - start < rounds, f"{rounds} scrapes went by without {what}"
            assert time.monotonic() - progressed_at < self.STALL_S, f"Prometheus stopped scraping, waiting for {what}"
            time.sleep(0.2)

    def wait_rounds(self, rounds: int) -> None:
        """Returns once Prometheus has scraped every target `rounds` more times."""
        start = self.scrape_rounds()
        self.wait_for(lambda: self.scrape_rounds() >= start + rounds, f"{rounds} scrapes", rounds + 1)

    def wait_until(self, expr: str, expected: float, rounds: int = 20) -> None:
        self.wait_ready()
        self.wait_for(lambda: self.scalar(expr) == expected, f"Prometheus: {expr} == {expected}", rounds)

    def wait_ready(self) -> None:
        """Until its HTTP API answers; a Prometheus that exits (a bad config) fails at once."""
        def ready() -> bool:
            assert self.proc.poll() is None, f"Prometheus exited ({self.proc.returncode}) while starting"
            try:
                return httpx.get(self.url + "/-/ready", timeout=60).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(ready, self.STALL_S, "Prometheus to start", 0.1)

    def stop(self) -> None:
        stop_process(self.proc)

    def start_again(self) -> None:
        """After `stop()`: the same command again (same port, same storage)."""
        self.proc = subprocess.Popen(self.proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
