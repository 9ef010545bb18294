"""The router's waiting requests in the autoscaler's signals: what scales a service up from zero."""
import asyncio

import httpx
from prometheus_client import generate_latest

from kubeinfer.operator.autoscaling.signals.metrics_source import router_queue, with_router_queue
from kubeinfer.operator.autoscaling.policies.reactive import decide
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals
from kubeinfer.runtime.router.metrics import RouterMetrics

NOW = 1_800_000_000.0


def router_metrics_text(waiting: int) -> str:
    """What a real router serves at /metrics, with `waiting` requests held for a replica."""
    metrics = RouterMetrics()
    metrics.queue_requests.set(waiting)
    return generate_latest(metrics.registry).decode()


def fetch(handler) -> float | None:
    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await router_queue(client, "http://router:8080/metrics")
    return asyncio.run(run())


def test_the_router_queue_is_read_from_its_metrics():
    assert fetch(lambda request: httpx.Response(200, text=router_metrics_text(3))) == 3
    assert fetch(lambda request: httpx.Response(503, text="draining")) is None
    assert fetch(lambda request: httpx.Response(200, text="# nothing here\n")) is None


def test_with_no_pod_the_router_queue_is_the_measurement_and_a_waiting_request_starts_a_replica():
    missing = Signals.missing("no pods to scrape", NOW)
    signals = with_router_queue(missing, 1.0, num_pods=0)
    assert signals.available and signals.queue_depth == 1.0 and signals.num_running == 0.0
    config = PolicyConfig(max_replicas=3, min_replicas=0, initial_delay_seconds=0)
    decision = decide(signals, ReplicaCounts(0, 0, 0), ScaleHistory(), config, NOW)
    assert decision.desired_replicas == 1 and decision.reason == "ScaleFromZero", decision
    # Nobody waiting at the router: zero stays zero.
    idle = decide(with_router_queue(missing, 0.0, num_pods=0), ReplicaCounts(0, 0, 0), ScaleHistory(), config, NOW)
    assert idle.desired_replicas == 0, idle


def test_the_router_queue_adds_to_the_pods_and_never_hides_their_failure():
    pods = Signals(timestamp=NOW, queue_depth=2.0, num_running=4.0, request_rate=1.0, num_pods_reporting=2)
    assert with_router_queue(pods, 5.0, num_pods=2).queue_depth == 7.0
    assert with_router_queue(pods, None, num_pods=2) is pods
    failed = Signals.missing("scrape failed: 10.0.0.1", NOW)
    assert not with_router_queue(failed, 5.0, num_pods=2).available
