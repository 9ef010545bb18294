"""The direct-scrape metrics source (`ScrapeSource`): the pods' own `/metrics`, for clusters without Prometheus (the
operator's default). It keeps a few snapshots per pod so that its TTFT P95, request rate, recent rate and
calibration usage cover the same ranges as the PromQL ones (`metrics_source.PrometheusSource`).

Exposition text is parsed by prometheus_client's parser, the operator's only one (escapes, histograms and
timestamps as Prometheus reads them; the operator reads a few texts per interval).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.measured import RECENT_COUNT_SPAN_S, RECENT_RANGE_S
from kubeinfer.operator.autoscaling.signals.metrics_histogram import histogram_quantile
from kubeinfer.operator.autoscaling.sizing.calibration import usage_from
from kubeinfer.operator.metric_names import (
    REQUEST_GENERATION_TOKENS, REQUEST_PROMPT_TOKENS, RUNNING, STEP, STEP_MOMENTS, TTFT, WAITING,
)

log = logging.getLogger(__name__)


@dataclass
class _PodSample:
    time: float
    waiting: float
    running: float
    buckets: dict[float, float]  # le -> cumulative count
    count: float
    counters: dict[str, float] = field(default_factory=dict)   # the calibration's series (`_COUNTERS`), summed


# Series of the predictive policy's calibration, by key: sample name -> (key, label whose value joins the key).
_COUNTERS = {f"{STEP}_count": ("steps", None), f"{STEP}_sum": ("step_seconds", None),
             STEP_MOMENTS: ("moment", "moment"), f"{REQUEST_PROMPT_TOKENS}_bucket": ("prompt", "le"),
             f"{REQUEST_GENERATION_TOKENS}_bucket": ("generation", "le")}
_FAMILIES = (WAITING, RUNNING, TTFT, STEP, STEP_MOMENTS.removesuffix("_total"), REQUEST_PROMPT_TOKENS,
             REQUEST_GENERATION_TOKENS)


def _usage(counters: dict[str, float]):
    def by(key: str, convert=str) -> dict:
        return {convert(k.split("/", 1)[1]): v for k, v in counters.items() if k.startswith(key + "/")}
    return usage_from(counters.get("steps"), counters.get("step_seconds"), by("moment"), by("prompt", float),
                      by("generation", float))


def parse_pod_metrics(text: str, model_name: str | None, at: float) -> _PodSample:
    """Sum the kubeinfer series of one pod's exposition text (one model or all)."""
    waiting = running = count = 0.0
    buckets: dict[float, float] = defaultdict(float)
    counters: dict[str, float] = defaultdict(float)
    seen_waiting = False
    for family in text_string_to_metric_families(text):
        if family.name not in _FAMILIES:
            continue
        for s in family.samples:
            if model_name is not None and s.labels.get("model_name") != model_name:
                continue
            if s.name in _COUNTERS:
                key, label = _COUNTERS[s.name]
                counters[key if label is None else f"{key}/{s.labels.get(label, '')}"] += s.value
            elif s.name == WAITING:
                waiting += s.value
                seen_waiting = True
            elif s.name == RUNNING:
                running += s.value
            elif s.name == f"{TTFT}_bucket":
                buckets[float(s.labels["le"])] += s.value
            elif s.name == f"{TTFT}_count":
                count += s.value
    if not seen_waiting:
        raise ValueError(f"no {WAITING} series" + (f" for model_name={model_name}" if model_name else ""))
    return _PodSample(at, waiting, running, dict(buckets), count, dict(counters))


class ScrapeTarget(NamedTuple):
    """What the direct scrape needs to know of a pod besides its /metrics URL (`pods.scrape_targets`)."""
    ready_since: float | None = None   # when it last became Ready: it has served requests from then
    pod: str | None = None             # its uid: a new pod on a reused IP keeps no snapshot of the old one


@dataclass
class ScrapeSource:
    """Direct scrape: the pods' counters, differenced against snapshots this source keeps, read as Prometheus'
    `increase()` and `rate()` would over the same ranges.

    - The window's TTFT P95, request rate and calibration usage are deltas against the newest snapshot of each
      pod taken at least `window_s` before now, scaled to the window when that snapshot is older (passes 5 s
      apart and a 10 s window read 10.1 s, a late pass more: unscaled, a pass 2 s late counted a fifth too much).
    - A pod without such a snapshot that has served (been Ready) for less than the window is read from zero: all
      it counted is in the window. One that has served longer (an operator that restarted beside it: its
      counters hold hours) gives no rate, TTFT or usage on its first pass, and its increase since it was first
      read, scaled to the window, until it has a snapshot a window old.
    - The recent rate (`recent_arrivals`) is each pod's first tokens since its oldest snapshot within
      `RECENT_RANGE_S`, over that span, summed: Prometheus' `rate(...[15s])` at one scrape per pass. A pod that
      became Ready within the range and has no snapshot counts its whole life over `RECENT_COUNT_SPAN_S`; any
      other pod without one leaves the recent rate unknown (the window's estimate decides).
    - A counter that went down (restarted process) is taken from zero. A pod that leaves the targets (not Ready
      for a while) keeps its snapshots for `forget_after_s`, so it is not read from zero when it comes back; they
      are kept per pod uid, so a new pod on a reused IP starts its own.
    - Any pod that cannot be read makes the whole signal missing: a partial sum would under-count the queue and
      invite a scale-down."""

    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=2.0))
    max_snapshots: int = 64
    forget_after_s: float = 600.0
    _history: dict[str, deque[_PodSample]] = field(default_factory=dict)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _scrape(self, url: str, model_name: str | None, at: float) -> _PodSample:
        resp = await self.client.get(url)
        resp.raise_for_status()
        return parse_pod_metrics(resp.text, model_name, at)

    async def fetch(self, targets: Mapping[str, ScrapeTarget] | Sequence[str], window_s: int,
                    model_name: str | None = None, now: float | None = None) -> Signals:
        """`targets`: the pods' /metrics URLs, each with its `ScrapeTarget` (a plain list: nothing known, read as
        pods that have served for less than a window)."""
        now = time.time() if now is None else now
        if not targets:
            return Signals.missing("no pods to scrape", now)
        known = targets if isinstance(targets, Mapping) else {}
        results = await asyncio.gather(*(self._scrape(u, model_name, now) for u in targets), return_exceptions=True)
        errors = [f"{u}: {r}" for u, r in zip(targets, results) if isinstance(r, BaseException)]
        if errors:
            log.warning("metrics scrape failed targets=%d errors=%s", len(errors), errors)
            return Signals.missing(f"scrape failed: {errors[0]}", now)
        total: dict[float, float] = defaultdict(float)
        counters: dict[str, float] = defaultdict(float)
        observed = 0.0
        unknown = False   # a pod that served longer than the window, read for the first time
        recent: float | None = 0.0
        for url, sample in zip(targets, results):
            target = known.get(url, ScrapeTarget())
            since = target.ready_since
            history = self._history.setdefault(url if target.pod is None else f"{url}#{target.pod}",
                                               deque(maxlen=self.max_snapshots))
            if history and sample.count < history[-1].count:
                history.clear()   # a restarted process: its counters start again
            recent = _plus(recent, _recent_rate(history, sample, since, now))
            served_longer = since is not None and since < now - window_s
            base = next((h for h in reversed(history) if h.time <= now - window_s), None)
            if base is None and history and served_longer:
                base = history[0]   # served longer than the window, first read less than a window ago
            scale = 1.0
            if base is None:
                unknown |= served_longer
                base = _PodSample(now, 0.0, 0.0, {}, 0.0)
            elif now > base.time:   # the snapshot lies a pass or more past the window: its increase, over the window
                scale = window_s / (now - base.time)
            for le, c in sample.buckets.items():
                total[le] += c - base.buckets.get(le, 0.0)
            observed += (sample.count - base.count) * scale
            for key, c in sample.counters.items():
                counters[key] += (c - base.counters.get(key, 0.0)) * scale
            history.append(sample)
            while len(history) > 1 and history[1].time <= now - max(window_s, RECENT_RANGE_S):
                history.popleft()  # keep one snapshot older than the window and the recent range, drop the rest
        for url in [u for u, h in self._history.items() if h[-1].time < now - self.forget_after_s]:
            del self._history[url]  # pods gone for a while
        queue, running = sum(s.waiting for s in results), sum(s.running for s in results)
        if unknown:
            return Signals(timestamp=now, queue_depth=queue, num_running=running, num_pods_reporting=len(targets),
                           recent_request_rate=recent)
        return Signals(timestamp=now, queue_depth=queue, num_running=running,
                       ttft_p95_seconds=histogram_quantile(0.95, total.items()) if observed > 0 else None,
                       request_rate=observed / window_s, num_pods_reporting=len(targets), usage=_usage(counters),
                       recent_request_rate=recent)


def _recent_rate(history: deque[_PodSample], sample: _PodSample, since: float | None, now: float) -> float | None:
    """One pod's first tokens per second over the recent range (None: unknown)."""
    first = next((h for h in history if now - RECENT_RANGE_S < h.time < now), None)
    if first is not None:
        return (sample.count - first.count) / (now - first.time)
    if since is not None and since > now - RECENT_RANGE_S:   # Ready within the range: all it counted is recent
        return sample.count / RECENT_COUNT_SPAN_S
    return None


def _plus(total: float | None, value: float | None) -> float | None:
    return None if total is None or value is None else total + value
