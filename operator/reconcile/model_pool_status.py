"""`status.modelPool` (spec.modelPool; reconcile.model_pool): for each ready replica, which models are awake and
asleep and how many wake-ups its engines have had, read from each engine's /metrics (open, like the adapters'
listing: no API key) on every reconcile pass. Services with a pool get a pass every `adapter_sync_seconds`
(operator.handlers), so the status follows the swaps within that. An engine that does not answer is listed as
unreachable; the others are still read.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from kubeinfer.operator.reconcile.lora.sync import ready_pods
from kubeinfer.operator.reconcile.model_pool import models
from kubeinfer.operator.spec import InferenceServiceSpec

log = logging.getLogger(__name__)
TIMEOUT = httpx.Timeout(5.0, connect=2.0)
SLEEP_QUERY = "/metrics?name[]=kubeinfer_engine_sleep_level&name[]=kubeinfer_engine_wakeups_total"


def _engine_state(client: httpx.Client, url: str) -> tuple[float, float]:
    """(sleep level, wake-ups) from an engine's /metrics."""
    level = wakeups = 0.0
    response = client.get(url + SLEEP_QUERY)
    response.raise_for_status()
    for line in response.text.splitlines():
        name, _, value = line.partition("{")
        if name == "kubeinfer_engine_sleep_level":
            level = float(value.rsplit(" ", 1)[1])
        elif name == "kubeinfer_engine_wakeups_total":
            wakeups += float(value.rsplit(" ", 1)[1])
    return level, wakeups


def observe(spec: InferenceServiceSpec, served_name: str, port: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """`status.modelPool`: each ready replica's awake and asleep models and its engines' wake-ups."""
    replicas = []
    with httpx.Client(timeout=TIMEOUT) as client:
        for p in ready_pods(pods):
            awake, asleep, unknown, wakeups = [], [], [], 0
            for name, model_port in models(spec, served_name, port).items():
                try:
                    level, woke = _engine_state(client, f"http://{p['status']['podIP']}:{model_port}")
                except (httpx.HTTPError, ValueError, IndexError) as error:
                    log.info("model pool: %s of %s: %s", name, p["metadata"]["name"], error)
                    unknown.append(name)
                    continue
                (asleep if level else awake).append(name)
                wakeups += int(woke)
            replicas.append({"pod": p["metadata"]["name"], "awake": awake, "asleep": asleep, "wakeups": wakeups,
                             **({"unreachable": unknown} if unknown else {})})
    return {"maxAwake": spec.model_pool.max_awake, "replicas": sorted(replicas, key=lambda r: r["pod"])}
