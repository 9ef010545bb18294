"""The calibration's series as the runtime exports them (`EngineMetrics`), read by the direct-scrape source: the
window's increase of the step moments and length histograms, summed over the pods, fits the step costs."""

from __future__ import annotations

import random

import httpx
import pytest
from prometheus_client import generate_latest

from kubeinfer.operator.autoscaling.sizing.calibration import Calibration
from kubeinfer.operator.autoscaling.signals.scrape_source import ScrapeSource, ScrapeTarget
from kubeinfer.runtime.engine.messages import EngineStats
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.server.metrics import EngineMetrics

COSTS = (0.02, 0.0008, 0.00012)


def run_steps(metrics: EngineMetrics, rng: random.Random, count: int) -> None:
    for _ in range(count):
        n, p = rng.randint(0, 32), rng.choice((0, 0, rng.randint(16, 4096)))
        t = COSTS[0] + COSTS[1] * n + COSTS[2] * p
        metrics.observe_stats(EngineStats(n, 0, 0.1, 0, 0, 0, step_decodes=n, step_prefill_tokens=p), t)


def finish(metrics: EngineMetrics, prompt: int, generated: int) -> None:
    metrics.record_output(RequestOutput("r", [1] * prompt, [1] * generated, "", [1], "", [], [], True, "length", None,
                                        0, 0.0, 0.0), 1.0)


def scrape_source(pods: dict[str, EngineMetrics]) -> ScrapeSource:
    """A direct scrape whose client answers each URL with its pod's exposition, read at every request."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=generate_latest(
        pods[str(request.url)].registry)))
    return ScrapeSource(client=httpx.AsyncClient(transport=transport))


def one_pod_source() -> tuple[ScrapeSource, EngineMetrics, str]:
    url, metrics = "http://10.0.0.1:8000/metrics", EngineMetrics("m")
    return scrape_source({url: metrics}), metrics, url


async def test_the_scrape_source_reads_the_windows_usage_and_it_fits_the_step_costs():
    pods = {f"http://10.0.0.{i}:8000/metrics": EngineMetrics("m") for i in (1, 2)}
    source = scrape_source(pods)
    rng = random.Random(0)
    for metrics in pods.values():   # before the window: not in its increase
        run_steps(metrics, rng, 300)
        finish(metrics, 5000, 3000)
    first = await source.fetch(list(pods), 60, model_name="m", now=1000.0)
    assert first.usage.moments.steps == 600   # a pod seen for the first time: its whole life
    for metrics in pods.values():
        run_steps(metrics, rng, 400)
        for prompt, generated in ((100, 10), (700, 30), (3000, 200)):
            finish(metrics, prompt, generated)
    signals = await source.fetch(list(pods), 60, model_name="m", now=1060.0)
    usage = signals.usage
    assert usage.moments.steps == 800
    assert dict(usage.prompt_tokens)[128.0] == 2 and dict(usage.prompt_tokens)[float("inf")] == 6
    assert dict(usage.generation_tokens)[12.0] == 2 and dict(usage.generation_tokens)[float("inf")] == 6
    assert usage.moments.fit() == pytest.approx(COSTS, rel=1e-6)
    assert Calibration().observe(usage, 1060.0, 60.0).step_costs == pytest.approx(COSTS, rel=1e-6)


async def test_a_late_pass_reads_the_increase_scaled_to_the_window():
    """Passes 60 s apart read a 60 s window exactly; one 15 s late reads 75 s of counts, scaled to 60 (as
    Prometheus' increase() extrapolates), so neither the request rate nor the calibration counts a fifth too much."""
    source, metrics, url = one_pod_source()
    rng = random.Random(1)
    await source.fetch([url], 60, model_name="m", now=1000.0)
    run_steps(metrics, rng, 600)
    for _ in range(30):
        finish(metrics, 100, 10)
    on_time = await source.fetch([url], 60, model_name="m", now=1060.0)
    assert (on_time.usage.moments.steps, on_time.request_rate) == (600, 0.5)
    run_steps(metrics, rng, 750)
    for _ in range(45):
        finish(metrics, 100, 10)
    late = await source.fetch([url], 60, model_name="m", now=1135.0)
    await source.aclose()
    assert late.usage.moments.steps == pytest.approx(600) and late.request_rate == pytest.approx(0.6)
    assert dict(late.usage.prompt_tokens)[float("inf")] == pytest.approx(36)


async def test_a_restarted_operator_does_not_read_a_pods_whole_life_as_one_window():
    """An operator that starts (or restarts) beside a pod that has served for an hour: the pod's counters hold the
    hour, not the window. Read as the window's increase they made the first pass see 60 times the request rate (and
    scale up for it). The time it became Ready says it has served longer than the window: its first pass has no rate
    and no usage, the next ones the increase since it was first read, scaled to the window (as Prometheus' rate()
    does over a range with fewer samples)."""
    source, metrics, url = one_pod_source()
    rng = random.Random(2)
    run_steps(metrics, rng, 3600)
    for _ in range(1800):   # an hour at 0.5 req/s
        finish(metrics, 100, 10)
    started = {url: ScrapeTarget(1000.0 - 3600)}
    first = await source.fetch(started, 60, model_name="m", now=1000.0)
    assert first.request_rate is None and first.usage is None and first.ttft_p95_seconds is None
    assert first.queue_depth == 0 and first.available   # the gauges are read
    run_steps(metrics, rng, 50)
    for _ in range(5):
        finish(metrics, 100, 10)
    second = await source.fetch(started, 60, model_name="m", now=1010.0)
    assert second.request_rate == pytest.approx(0.5) and second.usage.moments.steps == pytest.approx(300)
    # a pod Ready within the window (a cold start of minutes before it) is read from zero: all it served is in it
    young = {url: ScrapeTarget(1010.0 - 30)}
    fresh_source = scrape_source({url: metrics})
    assert (await fresh_source.fetch(young, 60, model_name="m", now=1010.0)).request_rate == pytest.approx(1805 / 60)
    await source.aclose()
    await fresh_source.aclose()


async def test_the_recent_rate_is_the_first_tokens_since_the_oldest_snapshot_in_the_range():
    """Prometheus' rate(...[15s]) at one scrape per pass: passes 5 s apart read the increase over the last 10 s.
    The fast arrival rule (`recent_arrivals`) had no such signal from the direct scrape, the default."""
    source, metrics, url = one_pod_source()
    ready = {url: ScrapeTarget(0.0)}
    for t, arrivals in ((1000.0, 0), (1005.0, 10), (1010.0, 10), (1015.0, 60)):
        for _ in range(arrivals):
            finish(metrics, 100, 10)
        signals = await source.fetch(ready, 60, model_name="m", now=t)
    # at 1015 the range (1000, 1015) holds the snapshots of 1005 and 1010: (80 - 10) / 10 s
    assert signals.recent_request_rate == pytest.approx(7.0)
    # a pod Ready 4 s ago, never read: all it served is recent, counted over the 10 s span
    source2, metrics2, url2 = one_pod_source()
    for _ in range(6):
        finish(metrics2, 100, 10)
    assert (await source2.fetch({url2: ScrapeTarget(1011.0)}, 60, model_name="m", now=1015.0)).recent_request_rate == 0.6
    # one Ready for long and never read: unknown, and the window's estimate decides
    source3, metrics3, url3 = one_pod_source()
    assert (await source3.fetch({url3: ScrapeTarget(0.0)}, 60, model_name="m", now=1015.0)).recent_request_rate is None
    for s in (source, source2, source3):
        await s.aclose()


async def test_a_pod_that_was_not_ready_for_a_while_is_not_read_from_zero_when_it_comes_back():
    """A pod that fails its readiness probe for a few passes leaves the targets. Its snapshots stay, so when it
    comes back (Ready again: a recent transition) its window is its increase, not its whole life."""
    pods = {f"http://10.0.0.{i}:8000/metrics": EngineMetrics("m") for i in (1, 2)}
    source = scrape_source(pods)
    steady, flapping = pods
    old_pod, back_at = ScrapeTarget(0.0), ScrapeTarget(1118.0)
    for _ in range(600):
        finish(pods[flapping], 100, 10)
    for t in (1000.0, 1060.0):
        await source.fetch({steady: old_pod, flapping: old_pod}, 60, model_name="m", now=t)
    for t in range(1065, 1120, 5):   # not Ready: the passes read the other pod alone
        await source.fetch({steady: old_pod}, 60, model_name="m", now=float(t))
    for _ in range(30):
        finish(pods[flapping], 100, 10)
    back = await source.fetch({steady: old_pod, flapping: back_at}, 60, model_name="m", now=1120.0)
    assert back.request_rate == pytest.approx(30 / 60)   # not its whole life's 630 / 60
    await source.aclose()


async def test_a_new_pod_on_a_reused_ip_keeps_no_snapshot_of_the_old_one():
    """Snapshots outlive a pod's absence (a readiness flap), so they are kept per pod uid: a new pod that gets a
    deleted pod's IP, and whose first scrape happens to count more first tokens than the old pod's last, is read
    from zero, not against the old pod's counters (whose steps could exceed its own and read negative)."""
    source, metrics, url = one_pod_source()
    for _ in range(5):
        finish(metrics, 100, 10)
    run_steps(metrics, random.Random(3), 2000)
    await source.fetch({url: ScrapeTarget(0.0, "old")}, 60, model_name="m", now=1000.0)
    new = EngineMetrics("m")   # the new pod behind the same URL: 8 requests, few steps
    for _ in range(8):
        finish(new, 100, 10)
    run_steps(new, random.Random(4), 50)
    metrics.registry = new.registry
    read = await source.fetch({url: ScrapeTarget(1095.0, "new")}, 60, model_name="m", now=1100.0)
    assert read.usage.moments.steps == 50 and read.request_rate == pytest.approx(8 / 60)
    await source.aclose()
