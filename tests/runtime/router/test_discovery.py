"""Replicas discovered from a Service's EndpointSlices: the pure part, then a real router against kmock."""
import asyncio
import json
import time

import aiohttp
import pytest

from kubeinfer.runtime.router.discovery import EndpointsFileWatch, parse_endpoints, ready_urls
from support.operator_harness import KApi, serve_cluster

SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"


def endpoint_slice(name: str, port: int, endpoints: list[tuple[str, bool | None]], address_type: str = "IPv4") -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": address_type,
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "llama"}},
            "ports": [{"name": "metrics-other", "port": 9000}, {"name": "http", "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {} if ready is None else {"ready": ready}}
                          for address, ready in endpoints]}


def test_ready_urls_take_ready_or_unknown_endpoints_on_the_named_port():
    slices = [endpoint_slice("a", 8000, [("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None)]),
              endpoint_slice("b", 8000, [("fd00::5", True)], "IPv6"),
              {"ports": [{"name": "grpc", "port": 1}], "endpoints": [{"addresses": ["10.0.0.9"]}]}]
    assert ready_urls(slices, "http") == {"http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::5]:8000"}
    assert ready_urls(slices, "nope") == set()


async def router_metric(session: aiohttp.ClientSession, url: str, name: str) -> float | None:
    try:
        async with session.get(url + "/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except aiohttp.ClientError:
        return None


async def eventually_metric(session, url: str, name: str, value: float, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := await router_metric(session, url, name)) != value:
        assert time.monotonic() < deadline, f"{name} stayed {seen}, expected {value}"
        await asyncio.sleep(0.05)


async def test_router_follows_the_services_ready_endpoints(kmock, tmp_path, monkeypatch, replicas, start_router):
    serve_cluster(kmock, tmp_path, monkeypatch)   # a kubeconfig for kmock in KUBECONFIG, which the router inherits
    kapi = KApi(str(kmock.url))
    replica_port = int(replicas[0].url.rsplit(":", 1)[1])
    await kapi.create(SLICES, endpoint_slice("llama-abc", replica_port, [("127.0.0.1", True), ("127.0.0.2", False)]))
    router = start_router([], "--service", "llama", "--namespace", "default")
    async with aiohttp.ClientSession() as session:
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 1)
        body = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 3, "ignore_eos": True}
        async with session.post(router.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["x-kubeinfer-replica"] == replicas[0].url
        # the pod turns unready: the router drops it (and would hold requests until one is ready again)
        await kapi.patch(f"{SLICES}/llama-abc", {"endpoints": [{"addresses": ["127.0.0.1"],
                                                                "conditions": {"ready": False}}]})
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 0)
        await kapi.patch(f"{SLICES}/llama-abc", {"endpoints": [{"addresses": ["127.0.0.1"],
                                                                "conditions": {"ready": True}}]})
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 1)
        await kapi.delete(f"{SLICES}/llama-abc")
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 0)
    assert "Traceback" not in router.log.read_text()


def test_parse_endpoints_tells_unknown_from_empty_and_refuses_what_is_not_a_list_of_urls():
    assert parse_endpoints("") is None and parse_endpoints("\n") is None   # annotation not written yet
    assert parse_endpoints("[]") == set()
    assert parse_endpoints('["http://10.0.0.1:8000/", "http://[fd00::5]:8000"]') == {
        "http://10.0.0.1:8000", "http://[fd00::5]:8000"}
    for bad in ('{"a": 1}', '["10.0.0.1:8000"]', '["http://a:1/v1"]', '["http://a"]', "[1]", "[not json"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_endpoints_file_watch_reports_changes_once_and_keeps_the_last_good_list(tmp_path):
    path = tmp_path / "endpoints"
    seen: list[set[str]] = []
    watch = EndpointsFileWatch(str(path), seen.append)
    watch.poll()                      # no file yet: nothing known, nothing reported
    path.write_text("")
    watch.poll()
    assert seen == []
    path.write_text('["http://10.0.0.1:8000"]')
    watch.poll()
    watch.poll()                      # unchanged: not reported again
    path.write_text("garbage")
    watch.poll()                      # bad: logged, the last list stays
    path.write_text('[]')
    watch.poll()
    assert seen == [{"http://10.0.0.1:8000"}, set()]


async def test_router_follows_its_endpoints_file_and_is_ready_once_it_was_written(replicas, start_router, tmp_path):
    path = tmp_path / "endpoints"
    path.write_text("")   # as a downward API file of an annotation the operator has not written yet
    router = start_router([], "--endpoints-file", str(path))
    async with aiohttp.ClientSession() as session:
        async def ready_status() -> int:
            async with session.get(router.url + "/ready") as response:
                return response.status
        deadline = time.monotonic() + 30
        while await router_metric(session, router.url, "kubeinfer_router_replicas_up") is None:
            assert time.monotonic() < deadline, router.log.read_text()
            await asyncio.sleep(0.05)
        assert await ready_status() == 503   # it does not know its replicas yet: no traffic for it
        path.write_text(json.dumps([replicas[0].url]))
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 1)
        assert await ready_status() == 200
        body = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 3, "ignore_eos": True}
        async with session.post(router.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["x-kubeinfer-replica"] == replicas[0].url
        path.write_text(json.dumps([r.url for r in replicas]))
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 2)
        path.write_text("[]")   # scaled to zero: known and empty, still ready (requests wait)
        await eventually_metric(session, router.url, "kubeinfer_router_replicas_up", 0)
        assert await ready_status() == 200
    assert "Traceback" not in router.log.read_text()
