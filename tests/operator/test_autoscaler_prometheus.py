"""The autoscaler end to end on real parts: two `kubeinfer serve --model demo` processes (the runtime, on
CPU, with 2 sequences per batch so that a queue forms), a real Prometheus (Debian's `prometheus`)
scraping them on loopback, `PrometheusSource` reading the PromQL signals, and the policy deciding.

Driving load raises the queue and the TTFT P95 and the policy asks for more replicas; removing it brings
the decision back down, but only after the (short) window in which a recommendation made under load
holds scale-down. The fleet stays
the two processes (nothing starts pods here), so every decision is taken against 2 ready replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kubeinfer.operator.autoscaling.policies import reactive as ap
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts
from kubeinfer.operator.autoscaling.signals.metrics_source import PodSelector, PrometheusSource
from support import PROMETHEUS_BIN, Prometheus, RuntimeServer, static_targets

MODEL = "tiny"
NUM_PODS = 2
CONFIG = PolicyConfig(min_replicas=1, max_replicas=8, target_queue_depth_per_replica=1.0,
                      target_ttft_p95_seconds=0.5, metric_window_seconds=5, scale_down_stabilization_seconds=6,
                      initial_delay_seconds=0)


@pytest.fixture
def runtime_pods(tmp_path: Path) -> Iterator[list[int]]:
    """Two runtime servers with the demo model, at most 2 running sequences each."""
    if PROMETHEUS_BIN is None:
        pytest.skip("prometheus binary not found (apt-get install -y prometheus)")
    servers = []
    try:
        for i in range(NUM_PODS):
            servers.append(RuntimeServer("demo", tmp_path / f"serve-{i}.log", "--max-num-seqs", "2",
                                         "--max-waiting-requests", "64", served_model_name=MODEL,
                                         env={"OMP_NUM_THREADS": "1"}))
        for server in servers:
            server.wait_ready(60)
        yield [server.port for server in servers]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def prometheus(tmp_path: Path, runtime_pods: list[int]) -> Iterator[Prometheus]:
    targets = static_targets(runtime_pods, "ns", "svc")
    prometheus = Prometheus(tmp_path / "prometheus", [{"job_name": "kubeinfer", "static_configs": targets}])
    try:
        prometheus.wait_until('count(up{job="kubeinfer"} == 1)', NUM_PODS)
        prometheus.wait_until("count(kubeinfer_num_requests_waiting)", NUM_PODS)
        yield prometheus
    finally:
        prometheus.stop()


async def _client_loop(client: httpx.AsyncClient, port: int, stop: asyncio.Event, done: list[int]) -> None:
    body = {"model": MODEL, "prompt": "the autoscaler under load", "max_tokens": 160, "ignore_eos": True}
    while not stop.is_set():
        r = await client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        done.append(1)


async def test_load_raises_the_decision_and_its_removal_brings_it_down_after_the_window(
        prometheus: Prometheus, runtime_pods: list[int]) -> None:
    source = PrometheusSource(prometheus.url)
    selector = PodSelector({"namespace": "ns", "service": "svc"}, model_name=MODEL)
    hist = ScaleHistory()  # a fresh operator: no scale-down before one window of its own
    fleet = ReplicaCounts(current=NUM_PODS, ready=NUM_PODS)
    log: list[tuple[float, float | None, float | None, int, str]] = []

    async def tick() -> ap.ScaleDecision:
        nonlocal hist
        signals = await source.fetch(selector, CONFIG.metric_window_seconds)
        assert signals.available, signals.error
        assert signals.num_pods_reporting == NUM_PODS
        d = ap.decide(signals, fleet, hist, CONFIG, time.time())
        hist = d.history
        log.append((time.time(), signals.queue_depth, signals.ttft_p95_seconds, d.desired_replicas, d.reason))
        return d

    stop, done = asyncio.Event(), []
    try:
        first = await tick()  # idle: it would go down, but not before one window of observations
        assert (first.desired_replicas, first.reason) == (NUM_PODS, ap.STABILIZING_DOWN), log
        async with httpx.AsyncClient(timeout=60) as client:
            # 6 clients per pod on 2 sequence slots: ~4 waiting per pod, TTFT ~2 generations long.
            workers = [asyncio.create_task(_client_loop(client, port, stop, done))
                       for port in runtime_pods for _ in range(6)]
            try:
                up, start = None, prometheus.scrape_rounds()
                while prometheus.scrape_rounds() - start < 30:  # bounded by Prometheus's scrapes, not seconds
                    await asyncio.sleep(1)
                    d = await tick()
                    if d.reason == ap.SCALE_UP and log[-1][2] is not None and log[-1][2] > CONFIG.target_ttft_p95_seconds:
                        up = d
                        break
                assert up is not None, f"the policy never asked for more replicas under load: {log}"
                loaded_at = log[-1][0]  # the scale-up decision under load
            finally:
                stop.set()
                await asyncio.gather(*workers)
        t, queue, ttft, desired, _ = log[-1]
        assert queue is not None and queue >= NUM_PODS * CONFIG.target_queue_depth_per_replica * 1.1, log[-1]
        assert desired > NUM_PODS, log[-1]
        assert done, "no request completed"

        # Load removed: the queue empties at once; the decision must not drop inside the window.
        down, start = None, prometheus.scrape_rounds()
        while prometheus.scrape_rounds() - start < 40:  # window + stabilization + scrapes to see the queue empty
            await asyncio.sleep(0.5)
            d = await tick()
            if d.desired_replicas < NUM_PODS:
                down = d
                break
            assert d.desired_replicas == NUM_PODS or d.reason == ap.SCALE_UP, log[-1]
        assert down is not None, f"the decision never came back down: {log}"
        assert down.reason == ap.SCALE_DOWN and down.desired_replicas == NUM_PODS - 1
        # The recommendations made under load (queue above target) hold scale-down for one metric
        # window after the last of them (steady ones would hold it for the whole stabilization window).
        last_high = max(t for t, _, _, n, _ in log if n > NUM_PODS)
        assert log[-1][0] - last_high >= CONFIG.metric_window_seconds - 0.1, log
        assert last_high >= loaded_at
        assert any(r == ap.STABILIZING_DOWN for *_, r in log), "it never waited for the window"
    finally:
        await source.aclose()
