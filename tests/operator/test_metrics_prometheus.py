"""The metrics sources against a real Prometheus (Debian's `prometheus` package) scraping real
processes on 127.0.0.1 that serve kubeinfer's metric names through prometheus_client.

`exporter_fleet` starts the processes; to point this test at the real runtime later, replace the
exporter script with `kubeinfer serve` and drive load instead of sending it `set`/`observe` lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kubeinfer.operator.autoscaling.signals.metrics_histogram import (
    TTFT_BUCKETS, bucket_of, cumulative_counts, histogram_quantile,
)
from kubeinfer.operator.autoscaling.signals.metrics_source import PodSelector, PrometheusSource
from kubeinfer.operator.autoscaling.signals.scrape_source import ScrapeSource
from kubeinfer.operator.autoscaling.signals.prometheus_fleet import FleetSignals
from support import Prometheus, free_port, static_targets

MODEL = "tiny-llama"
WINDOW_S = 30

# A process serving kubeinfer metrics; it reads JSON lines on stdin and exits at EOF.
EXPORTER = textwrap.dedent(f"""
    import json, sys
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
    reg = CollectorRegistry()
    waiting = Gauge("kubeinfer_num_requests_waiting", "w", ["model_name"], registry=reg)
    running = Gauge("kubeinfer_num_requests_running", "r", ["model_name"], registry=reg)
    ttft = Histogram("kubeinfer_time_to_first_token_seconds", "t", ["model_name"], registry=reg,
                     buckets={list(TTFT_BUCKETS[:-1])!r})
    # the predictive autoscaler's calibration series (kubeinfer.runtime.server.metrics)
    step = Histogram("kubeinfer_engine_step_seconds", "s", ["model_name"], registry=reg)
    moments = Counter("kubeinfer_engine_step_moments", "m", ["model_name", "moment"], registry=reg)
    prompt = Histogram("kubeinfer_request_prompt_tokens", "p", ["model_name"], registry=reg, buckets=[128, 256, 512])
    model = sys.argv[1]
    waiting.labels(model).set(0); running.labels(model).set(0); ttft.labels(model); step.labels(model)
    prompt.labels(model)
    for name in ("n", "p", "nn", "np", "pp", "nt", "pt"):
        moments.labels(model, name)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    print(server.server_port, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        waiting.labels(model).set(cmd["waiting"]); running.labels(model).set(cmd["running"])
        for v in cmd["observe"]:
            ttft.labels(model).observe(v)
        for n, p, t in cmd.get("steps", ()):
            step.labels(model).observe(t)
            for name, v in (("n", n), ("p", p), ("nn", n * n), ("np", n * p), ("pp", p * p), ("nt", n * t),
                            ("pt", p * t)):
                moments.labels(model, name).inc(v)
        for v in cmd.get("prompts", ()):
            prompt.labels(model).observe(v)
        print("ok", flush=True)
""")


class Exporter:
    def __init__(self, model: str):
        self.proc = subprocess.Popen([sys.executable, "-c", EXPORTER, model], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def send(self, waiting: int, running: int, observe: list[float], steps=(), prompts=()) -> None:
        self.proc.stdin.write(json.dumps({"waiting": waiting, "running": running, "observe": observe,
                                          "steps": list(steps), "prompts": list(prompts)}) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def metrics_exporter_fleet():
    """3 pods of service svc-a and 1 pod of another service (svc-b) that must never be counted."""
    pods = [Exporter(MODEL) for _ in range(3)]
    decoy = Exporter(MODEL)
    yield pods, decoy
    for e in pods + [decoy]:
        e.stop()


@pytest.fixture
def metrics_prometheus(tmp_path: Path, metrics_exporter_fleet):
    pods, decoy = metrics_exporter_fleet
    targets = (static_targets([e.port for e in pods], "ns1", "svc-a")
               + static_targets([decoy.port], "ns1", "svc-b"))
    prometheus = Prometheus(tmp_path, [{"job_name": "kubeinfer", "static_configs": targets}])
    try:
        prometheus.wait_until('count(up{job="kubeinfer"} == 1)', 4)
        yield prometheus
    finally:
        prometheus.stop()


# Per pod: waiting, running, TTFT observations. Overall 255 at 0.12 s and 45 at 0.7 s: 85% / 15%,
# so the 0.95 rank lies in the middle of the (0.6, 0.75] bucket, far from its edges.
GIVEN = [(3, 10, [0.12] * 100), (5, 20, [0.12] * 70 + [0.7] * 30), (7, 30, [0.12] * 85 + [0.7] * 15)]
# Engine steps (decoding sequences, prefill tokens, seconds) timed by a linear step model, spread over the pods.
COSTS = (0.02, 0.0008, 0.00012)
STEPS = [(n, p, COSTS[0] + COSTS[1] * n + COSTS[2] * p) for n in range(0, 30, 3) for p in (0, 0, 300, 2000)]


async def test_prometheus_and_scrape_sources_agree_with_what_the_pods_were_given(metrics_prometheus,
                                                                               metrics_exporter_fleet):
    pods, decoy = metrics_exporter_fleet
    selector = PodSelector({"namespace": "ns1", "service": "svc-a"}, model_name=MODEL)
    prom = PrometheusSource(metrics_prometheus.url)
    scrape = ScrapeSource()
    try:
        # Baseline: Prometheus and the scrape source have both seen the pods before any observation.
        await scrape.fetch([p.url for p in pods], WINDOW_S, model_name=MODEL)
        metrics_prometheus.wait_rounds(2)
        for k, (pod, (w, r, obs)) in enumerate(zip(pods, GIVEN)):
            pod.send(w, r, obs, steps=STEPS[k::3], prompts=[100, 300, 300, 1000])
        decoy.send(100, 32, [5.0] * 50)
        all_obs = [v for _, _, obs in GIVEN for v in obs]
        true_p95 = histogram_quantile(0.95, cumulative_counts(all_obs))
        lo, hi = bucket_of(0.7)

        decoy_selector = PodSelector({"namespace": "ns1", "service": "svc-b"}, MODEL)

        async def prom_caught_up():
            # Prometheus scrapes each target at its own offset: the decoy's scrape may come after the
            # pods', so wait for both, or the fleet's decoy row below could still read the zeros.
            s = await prom.fetch(selector, WINDOW_S)
            d = await prom.fetch(decoy_selector, WINDOW_S)
            ready = s.queue_depth == 15 and s.ttft_p95_seconds is not None and s.num_running == 60
            return s if ready and d.queue_depth == 100 else None
        start, sig = metrics_prometheus.scrape_rounds(), None
        while sig is None:   # the budget is Prometheus's scrapes, not seconds: a busy box scrapes later
            sig = await prom_caught_up()
            if sig is None:
                assert metrics_prometheus.scrape_rounds() - start < 10, \
                    "10 scrapes went by and Prometheus never reported queue 15 / running 60 with a TTFT P95 and the decoy's 100"
                time.sleep(0.3)

        # Queue and running exact (the decoy service's 100 waiting are filtered out); P95 in its bucket.
        assert (sig.queue_depth, sig.num_running, sig.num_pods_reporting) == (15, 60, 3)
        assert lo < sig.ttft_p95_seconds <= hi, (sig.ttft_p95_seconds, (lo, hi))
        assert abs(sig.ttft_p95_seconds - true_p95) <= hi - lo
        assert sig.request_rate and sig.request_rate > 0
        assert time.time() - sig.timestamp < 5, "sample timestamps are recent"

        # The fleet's one round of queries gives each service what its own queries give.
        fleet = FleetSignals(prom, max_age_s=60)
        row = await fleet.signals(selector, WINDOW_S)
        assert (row.queue_depth, row.num_running, row.num_pods_reporting) == (15, 60, 3)
        assert lo < row.ttft_p95_seconds <= hi and row.request_rate and row.request_rate > 0
        # the calibration's series: Prometheus' increase() of every pod's steps fits the step model they came from
        assert row.usage.moments.fit() == pytest.approx(COSTS, rel=1e-3)
        prompts = dict(row.usage.prompt_tokens)
        assert prompts[256.0] / prompts[float("inf")] == pytest.approx(0.25, rel=1e-3)   # 100 of 100, 300, 300, 1000
        assert prompts[512.0] / prompts[float("inf")] == pytest.approx(0.75, rel=1e-3)
        decoy_row = await fleet.signals(decoy_selector, WINDOW_S)
        assert (decoy_row.queue_depth, decoy_row.num_running, decoy_row.num_pods_reporting) == (100, 32, 1)

        direct = await scrape.fetch([p.url for p in pods], WINDOW_S, model_name=MODEL)
        assert (direct.queue_depth, direct.num_running, direct.num_pods_reporting) == (15, 60, 3)
        assert direct.ttft_p95_seconds == pytest.approx(true_p95)
        assert lo < direct.ttft_p95_seconds <= hi
        assert abs(direct.ttft_p95_seconds - sig.ttft_p95_seconds) <= hi - lo
        assert direct.request_rate == pytest.approx(300 / WINDOW_S)
        assert direct.usage.moments.steps == len(STEPS) and direct.usage.moments.fit() == pytest.approx(COSTS)

        # A selector that matches nothing, and a dead Prometheus, are missing signals, not zeros.
        none = await prom.fetch(PodSelector({"namespace": "ns1", "service": "nope"}), WINDOW_S)
        assert not none.available and "no kubeinfer_num_requests_waiting series" in none.error
        dead = PrometheusSource(f"http://127.0.0.1:{free_port()}")
        try:
            assert not (await dead.fetch(selector, WINDOW_S)).available
        finally:
            await dead.aclose()
        # One unreachable pod makes the direct scrape missing (a partial sum would under-count).
        partial = await scrape.fetch([p.url for p in pods] + [f"http://127.0.0.1:{free_port()}/metrics"], WINDOW_S)
        assert not partial.available and "scrape failed" in partial.error
    finally:
        await prom.aclose()
        await scrape.aclose()


def test_the_operator_reads_the_bucket_bounds_the_runtime_exports():
    """The operator names the runtime's histogram bounds again (its image has no runtime): the two must agree."""
    from kubeinfer.operator.autoscaling.signals import metrics_histogram as operator_side
    from kubeinfer.runtime.server import metrics as runtime_side
    for name in ("TTFT_BUCKETS", "PROMPT_TOKEN_BUCKETS", "GENERATION_TOKEN_BUCKETS"):
        ours, theirs = tuple(getattr(operator_side, name)), tuple(getattr(runtime_side, name))
        assert [b for b in ours if b != float("inf")] == [b for b in theirs if b != float("inf")], name
