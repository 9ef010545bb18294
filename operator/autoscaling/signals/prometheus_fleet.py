"""The Prometheus signals of every autoscaled InferenceService from one round of queries.

Each object's daemon asks `FleetSignals.signals()` for its own service; the first to ask in an interval sends
one query per signal for the whole fleet (`sum by (namespace, service, model_name, pool) (...)`), and every daemon
of that interval reads its service's row from that answer. 1,000 services make 12 queries per interval (per
distinct metricWindowSeconds), not 11,000.

Policy: an answer serves for `max_age_s` (the autoscale interval), so a decision may read signals up to one
interval older than its pass; Prometheus' own samples are a scrape interval old already. A failed round is kept
as long, as a missing signal for every service (the policy holds), so a Prometheus that is down gets one round
of queries per interval, not one per service.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable

import httpx

from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.measured import RECENT_RANGE_S
from kubeinfer.operator.autoscaling.signals.metrics_source import PodSelector, PrometheusSource
from kubeinfer.operator.autoscaling.sizing.calibration import usage_from
from kubeinfer.operator.metric_names import (
    REQUEST_GENERATION_TOKENS, REQUEST_PROMPT_TOKENS, RUNNING, STEP, STEP_MOMENTS, TTFT, WAITING,
)

log = logging.getLogger(__name__)

# The labels a series of one service carries (the ServiceMonitor's namespace and service, the runtime's model), and
# the pool of spec.disaggregation (the ServiceMonitor's relabeling; "" on a colocated replica's series).
ROW_LABELS = ("namespace", "service", "model_name", "pool")
Row = tuple[str, str, str, str]


def fleet_queries(window_s: int) -> dict[str, str]:
    """The queries of `metrics_source.promql_queries`, for every service at once."""
    by, w = ", ".join(ROW_LABELS), f"{int(window_s)}s"
    return {
        "queue": f"sum by ({by}) ({WAITING})",
        "running": f"sum by ({by}) ({RUNNING})",
        "ttft_p95": f"histogram_quantile(0.95, sum by ({by}, le) (rate({TTFT}_bucket[{w}])))",
        "rate": f"sum by ({by}) (rate({TTFT}_count[{w}]))",
        # first tokens per second over the last few seconds: the predictive policy's fast arrival signal (OPTIONAL)
        "recent_rate": f"sum by ({by}) (rate({TTFT}_count[{RECENT_RANGE_S}s]))",
        "pods": f"count by ({by}) ({WAITING})",
        "oldest": f"min by ({by}) (timestamp({WAITING}))",
        # the replicas' steps and request lengths over the window: the predictive policy's calibration (OPTIONAL)
        "steps": f"sum by ({by}) (increase({STEP}_count[{w}]))",
        "step_seconds": f"sum by ({by}) (increase({STEP}_sum[{w}]))",
        "moment": f"sum by ({by}, moment) (increase({STEP_MOMENTS}[{w}]))",
        "prompt": f"sum by ({by}, le) (increase({REQUEST_PROMPT_TOKENS}_bucket[{w}]))",
        "generation": f"sum by ({by}, le) (increase({REQUEST_GENERATION_TOKENS}_bucket[{w}]))",
    }


# Signals answered per value of one more label: the value is kept under "signal/label value".
PER_LABEL = {"moment": "moment", "prompt": "le", "generation": "le"}
# Signals whose failure leaves the others standing (the calibration is then not fed for one interval, and the
# predictive policy forecasts from the metric window's rate alone).
OPTIONAL = frozenset({"recent_rate", "steps", "step_seconds", "moment", "prompt", "generation"})


def _usage(v: dict[str, float]):
    def by(signal: str, key=str) -> dict:
        return {key(name.split("/", 1)[1]): value for name, value in v.items() if name.startswith(signal + "/")}
    return usage_from(v.get("steps"), v.get("step_seconds"), by("moment"), by("prompt", float), by("generation", float))


@dataclasses.dataclass(frozen=True)
class Snapshot:
    taken_at: float
    values: dict[Row, dict[str, float]]   # row -> signal name -> value (absent: no series)
    error: str | None = None

    def signals(self, selector: PodSelector) -> Signals:
        if self.error is not None:
            return Signals.missing(self.error, self.taken_at)
        assert selector.model_name is not None, "a fleet row is one model's"
        v = self.values.get((selector.labels["namespace"], selector.labels["service"], selector.model_name,
                             selector.labels.get("pool", "")), {})
        if "queue" not in v:
            return Signals.missing(f"no {WAITING} series for {selector.promql()}", self.taken_at)
        return Signals(timestamp=v.get("oldest", self.taken_at), queue_depth=v["queue"], num_running=v.get("running"),
                       ttft_p95_seconds=v.get("ttft_p95"), request_rate=v.get("rate"),
                       num_pods_reporting=int(v.get("pods", 0)), usage=_usage(v),
                       recent_request_rate=v.get("recent_rate"))


class FleetSignals:
    """One operator's shared answers, one per metric window; safe for every daemon of one event loop."""

    def __init__(self, source: PrometheusSource, max_age_s: float, clock: Callable[[], float] = time.time) -> None:
        self.source, self.max_age_s, self.clock = source, max_age_s, clock
        self._snapshots: dict[int, Snapshot] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def aclose(self) -> None:
        await self.source.aclose()

    async def signals(self, selector: PodSelector, window_s: int) -> Signals:
        lock = self._locks.setdefault(window_s, asyncio.Lock())
        async with lock:   # daemons arriving during a round wait for it instead of sending their own
            snapshot = self._snapshots.get(window_s)
            if snapshot is None or self.clock() - snapshot.taken_at >= self.max_age_s:
                snapshot = self._snapshots[window_s] = await self._take(window_s)
        return snapshot.signals(selector)

    async def _take(self, window_s: int) -> Snapshot:
        now = self.clock()
        queries = fleet_queries(window_s)
        failures = (httpx.HTTPError, RuntimeError, KeyError, ValueError)
        answers = await asyncio.gather(*(self.source.query_vector(q, now) for q in queries.values()),
                                       return_exceptions=True)
        failed = [(signal, a) for signal, a in zip(queries, answers) if isinstance(a, BaseException)]
        for signal, exc in failed:
            if not isinstance(exc, failures):
                raise exc
        required = [exc for signal, exc in failed if signal not in OPTIONAL]
        if required:
            log.warning("metrics prometheus failed url=%s error=%s", self.source.url, required[0])
            return Snapshot(now, {}, f"prometheus query failed: {required[0]}")
        if failed:
            log.warning("metrics prometheus calibration queries failed url=%s error=%s", self.source.url, failed[0][1])
        answers = [[] if isinstance(a, BaseException) else a for a in answers]
        values: dict[Row, dict[str, float]] = {}
        for signal, answer in zip(queries, answers):
            for labels, value in answer:
                if math.isfinite(value):
                    row = tuple(labels.get(k, "") for k in ROW_LABELS)
                    key = f"{signal}/{labels.get(PER_LABEL[signal], '')}" if signal in PER_LABEL else signal
                    values.setdefault(row, {})[key] = value   # type: ignore[index]
        return Snapshot(now, values)
