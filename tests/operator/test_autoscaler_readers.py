"""The autoscaler daemons of one operator share their HTTP clients (`readers.SharedReaders`).

An httpx client costs ~0.8 MiB (its TLS context); two per daemon made 200 autoscaled services cost the operator
330 MiB (benchmarks/operator_scale.py). Here: a thousand daemons' Autoscalers made with the operator's readers
construct no client at all, and read through the shared ones.
"""

from __future__ import annotations

import types

import httpx
import pytest

from kubeinfer.operator.autoscaling.autoscaler import Autoscaler
from kubeinfer.operator.autoscaling.signals.readers import SharedReaders
from kubeinfer.operator.config import OperatorConfig

NUM_SERVICES = 1000


@pytest.fixture()
def client_constructions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    original = httpx.AsyncClient.__init__

    def counting_init(self: httpx.AsyncClient, *args: object, **kwargs: object) -> None:
        made.append(1)
        original(self, *args, **kwargs)
    monkeypatch.setattr(httpx.AsyncClient, "__init__", counting_init)
    return made


@pytest.mark.parametrize("prometheus_url", ["", "http://prometheus.monitoring:9090"])
async def test_a_thousand_daemons_share_the_operators_clients(client_constructions: list[int],
                                                              prometheus_url: str) -> None:
    config = OperatorConfig(prometheus_url=prometheus_url)
    readers = SharedReaders.for_config(config)
    shared = len(client_constructions)
    ctx = types.SimpleNamespace(config=config)
    scalers = [Autoscaler(ctx, "ns", f"svc-{i}", readers) for i in range(NUM_SERVICES)]
    assert len(client_constructions) == shared, "no daemon makes a client of its own"
    assert {id(s.router_client) for s in scalers} == {id(readers.router_client)}
    if prometheus_url:
        assert {id(s.prometheus) for s in scalers} == {id(readers.prometheus)}   # one round of queries for all
    else:
        assert {id(s.source.client) for s in scalers} == {id(readers.scrape_client)}
        assert len({id(s.source) for s in scalers}) == NUM_SERVICES   # each keeps its own pods' snapshots
    for scaler in scalers:
        await scaler.aclose()
    assert not readers.router_client.is_closed, "a daemon that stops leaves the shared clients open"
    await readers.aclose()


async def test_a_daemon_without_shared_readers_makes_and_closes_its_own(client_constructions: list[int]) -> None:
    scaler = Autoscaler(types.SimpleNamespace(config=OperatorConfig()), "ns", "svc", None)
    assert client_constructions
    await scaler.aclose()
    assert scaler.router_client.is_closed and scaler.source.client.is_closed
