"""`kubeinfer pool`: one `kubeinfer serve` per model of a model pool's pod (docs/router.md, "Model pool"), model i on
port PORT + i, started one after the other so that the pod never holds more models awake than it may.

- Every model but the last `max_awake` starts with `--sleep-at-start LEVEL`; the next one starts only once the one
  before is asleep (its `kubeinfer_engine_sleep_level`) or, for the last ones, ready. So at start, as later, at most
  `max_awake` models are awake (plus the one loading, which is the next awake one or goes to sleep before the next).
  The router then wakes the model each request needs (router/pool.py).
- SIGTERM (or SIGINT) goes to every engine, which drains as `kubeinfer serve` does; the launcher exits once all
  have, 0 if they all did. An engine that exits on its own ends the pool: the others are stopped and the launcher
  exits non-zero, so that Kubernetes restarts the container (a half pool would answer 503s for good).
- On a GPU the models share its memory: each gets a 1/K part of `--gpu-memory-utilization` (`gpu_share`).
- The engines' output is the launcher's (the container's log), each line as `kubeinfer serve` writes it.
"""
import logging
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from kubeinfer.runtime.router.replicas import SCRAPE_PATH, parse_gauges

logger = logging.getLogger(__name__)
POLL_SECONDS = 0.2
STOP_SECONDS = 120.0   # an engine still running this long after SIGTERM (its drain included) is killed


def sleep_level(port: int) -> float | None:
    """The engine's sleep level from its /metrics, read as the router reads it; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{SCRAPE_PATH}", timeout=5) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return parse_gauges(text).values.get("sleep_level")


class PoolLauncher:
    def __init__(self, members: dict[str, str], max_awake: int, sleep_level: int, host: str, port: int,
                 serve_args: list[str], log_level: str = "INFO"):
        self.members, self.max_awake, self.level = members, max_awake, sleep_level
        self.host, self.port, self.serve_args, self.log_level = host, port, serve_args, log_level
        self.engines: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False

    def awake_rank(self, index: int) -> int:
        """1..K for the last K models, which start awake; 0 or less for the others, which sleep once started."""
        return index - (len(self.members) - self.max_awake) + 1

    def command(self, index: int, name: str, model: str) -> list[str]:
        asleep = self.awake_rank(index) <= 0
        return [sys.executable, "-m", "kubeinfer.runtime.cli", "--log-level", self.log_level, "serve",
                "--model", model, "--served-model-name", name, "--host", self.host, "--port", str(self.port + index),
                *(["--sleep-at-start", str(self.level)] if asleep else []), *self.serve_args,
                "--gpu-memory-utilization", f"{self.gpu_share(index):.4f}"]

    def gpu_share(self, index: int) -> float:
        """Model `index`'s `--gpu-memory-utilization` (the last flag wins: this one). A GPU engine sizes its KV cache
        to leave memory in use by every process below that share of the GPU, so with K models awake each must have
        a 1/K part of the pool's share: one that starts while the others sleep gets share / K; the j-th of the last
        K, which start awake beside j - 1 others, share * j / K. Each gets the same KV cache, and one waking after
        another's sleep finds its part free. (On a CPU the flag is unused.)"""
        share = float(self._flag("--gpu-memory-utilization") or 0.9)
        return share * max(1, self.awake_rank(index)) / self.max_awake

    def _flag(self, name: str) -> str | None:
        value = None
        for i, arg in enumerate(self.serve_args):
            if arg == name and i + 1 < len(self.serve_args):
                value = self.serve_args[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
        return value

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        for index, (name, model) in enumerate(self.members.items()):
            if self.stopping:
                break
            self.engines.append((name, subprocess.Popen(self.command(index, name, model))))
            if not self._wait_started(index, name):
                break
        return self._supervise()

    def _wait_started(self, index: int, name: str) -> bool:
        """Waits until model `index` is asleep (or awake, for the last ones); False if an engine exited or the
        pool is stopping."""
        asleep = self.awake_rank(index) <= 0
        started = time.monotonic()
        while not self.stopping and self._exited() is None:
            level = sleep_level(self.port + index)
            if level is not None and (level > 0) == asleep:
                logger.info("pool: model %r on port %d %s after %.1f s (%d of %d)", name, self.port + index,
                            f"asleep at level {self.level}" if asleep else "awake", time.monotonic() - started,
                            index + 1, len(self.members))
                return True
            time.sleep(POLL_SECONDS)
        return False

    def _exited(self) -> tuple[str, int] | None:
        for name, engine in self.engines:
            if engine.poll() is not None:
                return name, engine.returncode
        return None

    def _supervise(self) -> int:
        while not self.stopping:
            if (exited := self._exited()) is not None:
                logger.error("pool: the engine of model %r exited (%d): stopping the pool", *exited)
                self._terminate()
                return exited[1] or 1
            time.sleep(POLL_SECONDS)
        self._terminate()
        return max((engine.returncode or 0 for _, engine in self.engines), default=0)

    def _stop(self, signum, frame) -> None:
        self.stopping = True

    def _terminate(self) -> None:
        for _, engine in self.engines:
            if engine.poll() is None:
                engine.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for name, engine in self.engines:
            try:
                engine.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("pool: the engine of model %r did not stop: killed", name)
                engine.kill()
                engine.wait()
