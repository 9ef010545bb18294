"""`prometheus_fleet.FleetSignals`: the daemons of 1,000 services share one round of queries per interval.

A stand-in of Prometheus' query API on loopback counts the queries and answers the fleet queries with one row
per service (its own values); the autoscaler's per-service queries would each be one request. The same signals
against a real Prometheus are checked in test_metrics_prometheus.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from kubeinfer.operator.autoscaling.signals.metrics_source import PodSelector, PrometheusSource, promql_queries
from kubeinfer.operator.autoscaling.signals.prometheus_fleet import FleetSignals, fleet_queries
from kubeinfer.operator.autoscaling.signals.measured import RECENT_RANGE_S
from support.query_endpoint import serve_query_endpoint

NUM_SERVICES = 1000
WINDOW_S = 30
MAX_AGE_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class FleetPrometheus:
    """Answers each fleet query with one sample per service: queue i, running 2i, pods 1 + i % 3."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.down = False
        self.refuse_calibration = False
        self.refuse_recent = False

    def sample(self, i: int, value: float, **labels: str) -> dict:
        return {"metric": {"namespace": "ns", "service": f"svc-{i}", "model_name": f"model-{i}", **labels},
                "value": [0, repr(value)]}

    async def handle(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        self.queries.append(query)
        if self.down:
            return web.Response(status=503)
        if self.refuse_calibration and "increase(" in query:
            return web.Response(status=422, text="bad_data")
        if self.refuse_recent and f"[{RECENT_RANGE_S}s]" in query:
            return web.Response(status=422, text="bad_data")
        values = {"queue": lambda i: float(i), "running": lambda i: 2.0 * i, "pods": lambda i: 1.0 + i % 3,
                  "rate": lambda i: 0.5, "recent_rate": lambda i: 0.1 * i, "ttft_p95": lambda i: float("nan") if i % 2 else 0.25,
                  "oldest": lambda i: 999_990.0, "steps": lambda i: 100.0 + i, "step_seconds": lambda i: 3.0}
        # the calibration's series, one sample per service and label value
        per_label = {"moment": ("moment", {"n": 400.0, "p": 9000.0, "nn": 1800.0, "np": 2e4, "pp": 2e6, "nt": 14.0,
                                           "pt": 400.0}),
                     "prompt": ("le", {"128.0": 10.0, "256.0": 30.0, "+Inf": 40.0}),
                     "generation": ("le", {"16.0": 20.0, "+Inf": 40.0})}
        signal = next((name for window in (WINDOW_S, 60) for name, text in fleet_queries(window).items()
                       if text == query), None)
        if signal is None:
            return web.Response(status=400, text=f"unexpected query {query}")
        if signal in per_label:
            label, answers = per_label[signal]
            result = [self.sample(i, v, **{label: k}) for i in range(NUM_SERVICES) for k, v in answers.items()]
        else:
            result = [self.sample(i, values[signal](i)) for i in range(NUM_SERVICES)]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture()
async def prometheus() -> AsyncIterator[tuple[FleetPrometheus, str]]:
    fake = FleetPrometheus()
    async with serve_query_endpoint(fake.handle) as url:
        yield fake, url


def selector(i: int) -> PodSelector:
    return PodSelector({"namespace": "ns", "service": f"svc-{i}"}, model_name=f"model-{i}")


async def test_a_thousand_daemons_make_one_query_per_signal_per_interval(prometheus) -> None:
    fake, url = prometheus
    clock = Clock()
    fleet = FleetSignals(PrometheusSource(url), max_age_s=MAX_AGE_S, clock=clock)
    try:
        first = await asyncio.gather(*(fleet.signals(selector(i), WINDOW_S) for i in range(NUM_SERVICES)))
        per_interval = len(fleet_queries(WINDOW_S))
        assert per_interval == len(promql_queries(selector(0), WINDOW_S)) + 5   # + the calibration's series
        assert per_interval == 12   # the six signals, the recent first-token rate, the calibration's five
        assert len(fake.queries) == per_interval, "one query per signal for the whole fleet"

        clock.now += MAX_AGE_S - 0.1   # later passes of the same interval read the same answer
        await asyncio.gather(*(fleet.signals(selector(i), WINDOW_S) for i in range(0, NUM_SERVICES, 7)))
        assert len(fake.queries) == per_interval
        clock.now += 0.1               # the next interval asks again, once
        await asyncio.gather(*(fleet.signals(selector(i), WINDOW_S) for i in range(NUM_SERVICES)))
        assert len(fake.queries) == 2 * per_interval
    finally:
        await fleet.aclose()

    for i in (0, 1, 2, 998, 999):   # each service reads its own row
        s = first[i]
        assert (s.queue_depth, s.num_running, s.num_pods_reporting, s.request_rate) == (i, 2 * i, 1 + i % 3, 0.5)
        assert s.ttft_p95_seconds == (None if i % 2 else 0.25)   # NaN (no first token) is no value
        assert s.recent_request_rate == pytest.approx(0.1 * i)     # the fast arrival signal, from the same round
        assert s.timestamp == 999_990.0 and s.available
        m = s.usage.moments   # the calibration's series: one StepMoments per row, the buckets by bound
        assert (m.steps, m.t, m.n, m.p, m.nn, m.np, m.pp, m.nt, m.pt) == (100 + i, 3, 400, 9000, 1800, 2e4, 2e6, 14, 400)
        assert s.usage.prompt_tokens == ((128.0, 10.0), (256.0, 30.0), (float("inf"), 40.0))
        assert s.usage.generation_tokens == ((16.0, 20.0), (float("inf"), 40.0))


async def test_a_service_without_series_and_a_prometheus_down_are_missing_signals(prometheus) -> None:
    fake, url = prometheus
    clock = Clock()
    fleet = FleetSignals(PrometheusSource(url), max_age_s=MAX_AGE_S, clock=clock)
    try:
        absent = await fleet.signals(PodSelector({"namespace": "ns", "service": "svc-1"}, model_name="other"),
                                     WINDOW_S)
        assert not absent.available and "no kubeinfer_num_requests_waiting series" in absent.error

        fake.down, sent = True, len(fake.queries)
        clock.now += MAX_AGE_S
        down = await asyncio.gather(*(fleet.signals(selector(i), WINDOW_S) for i in range(NUM_SERVICES)))
        assert all(not s.available and "prometheus query failed" in s.error for s in down)
        assert len(fake.queries) - sent <= len(fleet_queries(WINDOW_S)), "a failed round is not retried per service"
    finally:
        await fleet.aclose()


async def test_each_metric_window_has_its_own_round(prometheus) -> None:
    fake, url = prometheus
    fleet = FleetSignals(PrometheusSource(url), max_age_s=MAX_AGE_S, clock=Clock())
    try:
        await fleet.signals(selector(0), WINDOW_S)
        sent = len(fake.queries)
        await fleet.signals(selector(1), 60)
        assert len(fake.queries) - sent == len(fleet_queries(60))
        assert any("[60s]" in q for q in fake.queries[sent:])
    finally:
        await fleet.aclose()


async def test_failing_calibration_queries_leave_the_other_signals_standing(prometheus) -> None:
    fake, url = prometheus
    fake.refuse_calibration = True
    fleet = FleetSignals(PrometheusSource(url), max_age_s=MAX_AGE_S, clock=Clock())
    try:
        s = await fleet.signals(selector(3), WINDOW_S)
    finally:
        await fleet.aclose()
    assert s.available and (s.queue_depth, s.num_running) == (3, 6) and s.usage is None


async def test_a_failing_recent_rate_query_leaves_the_window_signals_standing(prometheus) -> None:
    fake, url = prometheus
    fake.refuse_recent = True
    fleet = FleetSignals(PrometheusSource(url), max_age_s=MAX_AGE_S, clock=Clock())
    try:
        s = await fleet.signals(selector(3), WINDOW_S)
    finally:
        await fleet.aclose()
    assert s.available and s.request_rate == 0.5 and s.recent_request_rate is None   # the window's rate decides
