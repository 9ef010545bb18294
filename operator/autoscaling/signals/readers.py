"""What every autoscaler daemon of one operator reads its signals through, made once at start-up.

- one HTTP client for the pods' and the routers' /metrics: an httpx client holds ~0.8 MiB of TLS state, and two
  per daemon made an operator with 200 autoscaled services grow from 118 to 450 MiB (benchmarks/operator_scale.py);
- with a Prometheus URL, the fleet's shared answers (`prometheus_fleet`): one round of queries per interval.
Each daemon keeps only its own state (the direct scrape's snapshots of its pods).
"""

from __future__ import annotations

import dataclasses

import httpx

from kubeinfer.operator.autoscaling.signals.metrics_source import PrometheusSource
from kubeinfer.operator.autoscaling.signals.prometheus_fleet import FleetSignals
from kubeinfer.operator.config import OperatorConfig

SCRAPE_TIMEOUT_S = 2.0
ROUTER_TIMEOUT_S = 3.0


@dataclasses.dataclass
class SharedReaders:
    scrape_client: httpx.AsyncClient
    router_client: httpx.AsyncClient
    prometheus: FleetSignals | None

    @classmethod
    def for_config(cls, config: OperatorConfig) -> SharedReaders:
        prometheus = None
        if config.prometheus_url:
            prometheus = FleetSignals(PrometheusSource(config.prometheus_url),
                                      max_age_s=config.autoscale_interval_seconds)
        return cls(httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S), httpx.AsyncClient(timeout=ROUTER_TIMEOUT_S),
                   prometheus)

    async def aclose(self) -> None:
        await self.scrape_client.aclose()
        await self.router_client.aclose()
        if self.prometheus is not None:
            await self.prometheus.aclose()
