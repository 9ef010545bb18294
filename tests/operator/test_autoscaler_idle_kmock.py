"""The running operator's autoscaler writes no status for an idle service (kmock, a stand-in Prometheus):
the requests counted are the operator's own PATCHes of the InferenceService's status."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.autoscaler_kmock import (
    INTERVAL, ISVC, FakePrometheus, config_for, manifest, quiesce, ready_pods, serve_prometheus,
)
from support.operator_harness import NAMESPACE, isvc_path, running_operator, write_requests

PASSES = 15
SETTLE_PASSES = 3


@pytest.fixture()
async def prom() -> AsyncIterator[FakePrometheus]:
    async with serve_prometheus() as fake:
        yield fake


def status_writes(cluster: Any, start: int = 0) -> list[Any]:
    return [r for r in write_requests(cluster, start) if r.subresource == "status"]


def passes(prom: FakePrometheus) -> int:
    """Fleet rounds of queries: one per autoscaler pass here (one service)."""
    return sum(q.startswith("sum by (namespace, service, model_name, pool) (kubeinfer_num_requests_waiting")
               for q in prom.queries)


async def test_an_idle_service_makes_no_status_write_once_settled(cluster: Any, kapi: Any,
                                                                  prom: FakePrometheus) -> None:
    prom.queue, prom.running, prom.rate, prom.pods = 0.0, 0.0, 0.0, 2.0
    async with running_operator(cluster, config_for(prom)):
        await ready_pods(kapi, 2)
        await kapi.create(isvc_path(NAMESPACE), manifest(replicas=2, minReplicas=2))
        await kapi.eventually(ISVC, lambda o: o.get("status", {}).get("scalingHistory"))
        # Settled: reconcile's own first writes, and the autoscaler's first passes (its history's first samples). Counted
        # in passes, not seconds: under load three intervals held fewer than three passes, and a first write fell in.
        settling = passes(prom)
        while passes(prom) - settling < SETTLE_PASSES:
            await asyncio.sleep(INTERVAL)
        start, first = len(list(cluster)), passes(prom)
        # No deadline of its own: how long 15 passes take depends on the box (10 s was not enough under load);
        # an autoscaler that stopped passing ends the test at pytest's timeout.
        while passes(prom) - first < PASSES:
            await asyncio.sleep(INTERVAL)
        writes = status_writes(cluster, start)
        obj = await kapi.get(ISVC)
        await quiesce(kapi)
    assert writes == [], [(r.method, str(r.url), r.data) for r in writes]
    assert obj["spec"]["replicas"] == 2 and obj["status"]["lastSignals"]["reason"] == "WithinTolerance"
