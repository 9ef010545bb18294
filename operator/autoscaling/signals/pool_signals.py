"""The signals of each pool of spec.disaggregation, read as a colocated fleet's are (Prometheus, else the pods'
/metrics), each pool apart.

Policy, decided here (docs/disaggregation.md, "Autoscaling the pools"):
- Each pool is measured on its own pods: with Prometheus, the fleet's row of the service's series whose `pool`
  label is the pool's (the ServiceMonitor copies it from the pods' `kubeinfer.dev/pool`); without, the Ready
  pods of the pool, each pool with its own scrape history.
- The prefill pool scales on its queue (pulls waiting for a prefill slot) and on the service's TTFT P95 and
  arrival rate, which are measured where the answers start: on the decode pool (a pull is not an HTTP request
  of the prefill replica, whose TTFT histogram it never enters).
- The decode pool scales on its queue and running requests, its KV cache use (mean over its pods) and its
  inter-token latency P95 (over the metric window with Prometheus; since the previous pass when scraping).
- Requests waiting at the router count as queued in both pools: one request at the router wakes both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.metrics_histogram import histogram_quantile
from kubeinfer.operator.autoscaling.signals.metrics_source import PodSelector, with_router_queue
from kubeinfer.operator.autoscaling.signals.pods import PROMETHEUS_LABELS, scrape_targets
from kubeinfer.operator.autoscaling.signals.prometheus_fleet import FleetSignals
from kubeinfer.operator.autoscaling.signals.scrape_source import ScrapeSource
from kubeinfer.operator.metric_names import ITL, KV_USAGE
from kubeinfer.operator.reconcile import pools
from kubeinfer.operator.spec import POOLS, InferenceServiceSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DecodeExtras:
    itl_p95_seconds: float | None
    kv_cache_usage: float | None


@dataclasses.dataclass
class PoolReaders:
    """What one service's pool signals keep between passes: a scrape history per pool (a ScrapeSource forgets
    the pods that are not among its targets), and each decode pod's ITL histogram at the previous pass."""

    client: httpx.AsyncClient
    sources: dict[str, ScrapeSource] = dataclasses.field(default_factory=dict)
    itl_seen: dict[str, dict[float, float]] = dataclasses.field(default_factory=dict)

    def source(self, role: str) -> ScrapeSource:
        return self.sources.setdefault(role, ScrapeSource(client=self.client))


def combine(pod_signals: dict[str, Signals], extras: DecodeExtras, router_waiting: float | None,
            num_pods: dict[str, int]) -> dict[str, Signals]:
    """Each pool's signals for the policy (the rules above), from what each pool's pods said."""
    prefill, decode = pod_signals["prefill"], pod_signals["decode"]
    if prefill.available and decode.available:
        prefill = replace(prefill, ttft_p95_seconds=decode.ttft_p95_seconds, request_rate=decode.request_rate,
                          recent_request_rate=decode.recent_request_rate)
    elif prefill.available:   # nothing measures first tokens: no TTFT, and no arrivals known
        prefill = replace(prefill, ttft_p95_seconds=None, request_rate=None, recent_request_rate=None)
    if decode.available:
        decode = replace(decode, ttft_p95_seconds=None, itl_p95_seconds=extras.itl_p95_seconds,
                         kv_cache_usage=extras.kv_cache_usage)
    return {"prefill": with_router_queue(prefill, router_waiting, num_pods["prefill"]),
            "decode": with_router_queue(decode, router_waiting, num_pods["decode"])}


async def pool_signals(prometheus: FleetSignals | None, readers: PoolReaders, spec: InferenceServiceSpec, namespace: str,
                       name: str, served: str, pods: list[dict[str, Any]],
                       router_waiting: float | None) -> dict[str, Signals]:
    """Both pools' signals for one pass (`prometheus`: the operator's FleetSignals, None: scrape the pods)."""
    assert spec.disaggregation is not None and spec.disaggregation.autoscaled
    windows = {role: spec.disaggregation.pool(role).autoscaling.metric_window_seconds for role in POOLS}
    by_role = {role: pools.pods_of(pods, role) for role in POOLS}
    if prometheus is not None:
        selectors = {role: PodSelector({**dict(zip(PROMETHEUS_LABELS, (namespace, name))), "pool": role},
                                       model_name=served) for role in POOLS}
        found = await asyncio.gather(*(prometheus.signals(selectors[role], windows[role]) for role in POOLS))
        extras = await _prometheus_extras(prometheus.source, selectors["decode"], windows["decode"])
    else:
        found = await asyncio.gather(*(readers.source(role).fetch(scrape_targets(by_role[role]), windows[role],
                                                                   model_name=served) for role in POOLS))
        extras = await _scraped_extras(readers, scrape_targets(by_role["decode"]), served)
    return combine(dict(zip(POOLS, found)), extras, router_waiting, {r: len(p) for r, p in by_role.items()})


async def _prometheus_extras(source: Any, selector: PodSelector, window_s: int) -> DecodeExtras:
    sel = selector.promql()
    queries = (f"histogram_quantile(0.95, sum by (le) (rate({ITL}_bucket{sel}[{int(window_s)}s])))",
               f"avg({KV_USAGE}{sel})")
    now = time.time()
    try:
        answers = await asyncio.gather(*(source.query_vector(q, now) for q in queries))
    except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as error:
        log.warning("decode pool signals: prometheus failed url=%s error=%s", source.url, error)
        return DecodeExtras(None, None)
    values = [a[0][1] if a and math.isfinite(a[0][1]) else None for a in answers]
    return DecodeExtras(*values)


async def _scraped_extras(readers: PoolReaders, targets: Collection[str], served: str) -> DecodeExtras:
    """ITL P95 since the previous pass and mean KV cache use of the decode pods (None where unknown: a pod that
    cannot be read leaves both unknown, and the policy then decides on the other signals)."""
    texts = await asyncio.gather(*(readers.client.get(u) for u in targets), return_exceptions=True)
    usage: list[float] = []
    delta: dict[float, float] = defaultdict(float)
    seen = {}
    for url, response in zip(targets, texts):
        if isinstance(response, BaseException) or response.status_code != 200:
            log.warning("decode pool signals: %s: %s", url, response)
            return DecodeExtras(None, None)
        buckets, kv = _parse(response.text, served)
        before = readers.itl_seen.get(url, {})
        if any(c < before.get(le, 0.0) for le, c in buckets.items()):
            before = {}   # a restarted pod: its counts start again
        for le, c in buckets.items():
            delta[le] += c - before.get(le, 0.0)
        seen[url] = buckets
        if kv is not None:
            usage.append(kv)
    readers.itl_seen = seen
    observed = max(delta.values(), default=0.0)
    itl = histogram_quantile(0.95, delta.items()) if observed > 0 else None
    return DecodeExtras(itl, sum(usage) / len(usage) if usage else None)


def _parse(text: str, served: str) -> tuple[dict[float, float], float | None]:
    buckets: dict[float, float] = defaultdict(float)
    kv = None
    for family in text_string_to_metric_families(text):
        if family.name not in (ITL, KV_USAGE):
            continue
        for s in family.samples:
            if s.labels.get("model_name") != served:
                continue
            if s.name == f"{ITL}_bucket":
                buckets[float(s.labels["le"])] += s.value
            elif s.name == KV_USAGE:
                kv = s.value
    return dict(buckets), kv
