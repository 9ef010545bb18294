"""Real processes: `kubeinfer serve` replicas of the tiny Llama and `kubeinfer router` in front of them."""
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support import RuntimeServer, free_port, scrape_metrics, stop_process, wait_for


class RouterProcess:
    """`kubeinfer router` on a free loopback port, its output in `log`."""

    def __init__(self, upstreams: list[str], log: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_file = log.open("w")
        upstream_args = [arg for url in upstreams for arg in ("--upstream", url)]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBEINFER_")}   # KUBECONFIG stays
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "router", *upstream_args, "--host", "127.0.0.1",
             "--port", str(self.port), *args], env=environment, stdout=self._log_file, stderr=subprocess.STDOUT)

    def wait_up(self, num_replicas: int, timeout_s: float = 30) -> "RouterProcess":
        """Waits until the router serves and has `num_replicas` replicas up."""
        def up():
            assert self.proc.poll() is None, f"the router exited:\n{self.log.read_text()[-3000:]}"
            try:
                return self.metric("kubeinfer_router_replicas_up") == num_replicas
            except httpx.HTTPError:
                return False
        wait_for(up, timeout_s, f"the router with {num_replicas} replicas up", 0.05)
        return self

    def metric(self, name: str, **labels) -> float:
        return scrape_metrics(self.url).get((name, tuple(sorted(labels.items()))), 0.0)

    def stop(self) -> None:
        stop_process(self.proc)
        self._log_file.close()


@pytest.fixture(scope="session")
def replicas(llama_dir, tmp_path_factory):
    """Two replicas of the tiny Llama, shared by every module that needs healthy replicas (none stops them: tests
    that kill a replica start their own victim beside these)."""
    logs = tmp_path_factory.mktemp("replicas")
    servers = [RuntimeServer(llama_dir, logs / f"replica{i}.log", "--max-model-len", "512", "--cpu-threads", "1")
               for i in range(2)]
    try:
        yield [server.wait_ready() for server in servers]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def start_router(tmp_path):
    started: list[RouterProcess] = []

    def start(upstreams: list[str], *args: str) -> RouterProcess:
        router = RouterProcess(upstreams, tmp_path / f"router{len(started)}.log", *args)
        started.append(router)
        return router
    yield start
    for router in started:
        router.stop()
