"""The router as the operator deploys it (`spec.router`), on a real cluster: its pods learn the ready replicas from
the operator (an annotation read through a downward API file: they never reach the API server, which the local
cluster's pods cannot), clients call the Service NAME-router, a load test with cancelling clients leaves nothing
behind on the replicas, and a request waiting at the router scales a service up from zero with no
`routerMetricsUrl` set.

Traffic goes only to the cluster's pod and Service addresses, bounded (a count of requests, `max_tokens`, a
deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import streams
from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, pods_of, ready_pods, namespace_scene, service_url, start_operator,
)
from support.router_view import metrics, replica_urls, router_pods, told, total

SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "runtime": {"imagePullPolicy": "IfNotPresent"},
        "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}}
# The load: 4 shared system prompts x users, streams of up to 48 tokens, 12 at a time; one in three clients
# leaves after its third chunk, and a few non-streamed requests are abandoned while the replica works on them.
NUM_REQUESTS, CONCURRENCY, MAX_TOKENS, CANCEL_EVERY = 96, 12, 48, 3
SYSTEM_PROMPTS = [f"System {i}: you are a careful assistant for team {i}. " * 4 for i in range(4)]


@pytest.fixture(scope="module")
def cluster(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    work: Path = tmp_path_factory.mktemp("router")
    with namespace_scene(kube) as (ns, stack):
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image,
                                                               env={"KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "1"}))
        yield ns, operator


def create(kube: Any, ns: str, name: str, spec: dict[str, Any]) -> None:
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": name, "namespace": ns},
        "spec": spec})


def test_operator_deploys_the_router_and_tells_it_the_ready_replicas(
        kube: Any, cluster: tuple, timings: dict[str, float]) -> None:
    ns, operator = cluster
    started = time.monotonic()
    create(kube, ns, "routed", {**SPEC, "replicas": 2, "router": {}})
    eventually(lambda: len(ready_pods(kube, ns, "routed")) == 2, 240, "two ready replicas", 0.5)
    want = replica_urls(kube, ns, "routed")
    [pod] = eventually(lambda: [p for p in router_pods(kube, ns, "routed")
                                if told(p) == want and condition(p, "Ready").get("status") == "True"] or None,
                       60, "a Ready router pod told both replicas", 0.3)
    timings["router: apply -> router Ready and told 2 ready replicas"] = time.monotonic() - started
    obj = kube.get(isvc_path(ns, "routed"))
    assert obj["status"]["endpoint"] == f"http://routed-router.{ns}.svc/v1"
    assert pod["spec"].get("automountServiceAccountToken") is False   # no API access: the operator tells it
    router_url = f"http://{pod['status']['podIP']}:8080"
    eventually(lambda: total(metrics(router_url), "kubeinfer_router_replicas_up") == 2, 30, "both replicas up")
    # Clients call the router's Service; the answer comes from one of the replicas.
    base = service_url(kube, ns, "routed-router")
    response = httpx.post(base + "/completions", json={"model": "routed", "prompt": "Kubernetes is", "max_tokens": 8,
                                                        "ignore_eos": True}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-kubeinfer-replica"] in want
    assert response.json()["usage"]["completion_tokens"] == 8
    result = streams.stream_completion(streams.client(base), "routed", "Kubernetes is", 8)
    assert result.whole(8), result
    # One replica goes: the operator tells the router at once (its pod's deletion), no request is lost.
    gone = ready_pods(kube, ns, "routed")[0]
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{gone['metadata']['name']}")
    left = f"http://{gone['status']['podIP']}:8000"
    eventually(lambda: left not in (told(router_pods(kube, ns, "routed")[0]) or [left]), 30,
               "the deleted replica out of the router's list", 0.2)
    eventually(lambda: len(ready_pods(kube, ns, "routed")) == 2, 240, "the replacement ready", 0.5)
    eventually(lambda: told(router_pods(kube, ns, "routed")[0]) == replica_urls(kube, ns, "routed"), 30,
               "the replacement in the router's list", 0.3)
    assert "Traceback" not in operator.output()


async def _one(client: httpx.AsyncClient, base: str, i: int, rng: random.Random) -> dict[str, Any]:
    """One client: a stream read to its end, a stream left after 3 chunks, or a non-streamed request abandoned."""
    prompt = SYSTEM_PROMPTS[i % len(SYSTEM_PROMPTS)] + f"User {i}: tell me about topic {rng.randint(0, 999)}."
    body = {"model": "routed", "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    kind = "cancel" if i % CANCEL_EVERY == 1 else "abandon" if i % 16 == 5 else "whole"
    if kind == "abandon":   # the client gives up while the replica works on the request
        try:
            await client.post(base + "/completions", json=body, timeout=0.3)
        except httpx.TimeoutException:
            return {"kind": kind, "status": None}
        return {"kind": kind, "status": "answered before the timeout"}
    chunks, finish, tokens, sent, first = 0, None, None, time.monotonic(), None
    async with client.stream("POST", base + "/completions", json={**body, "stream": True,
                                                                  "stream_options": {"include_usage": True}},
                             timeout=180) as response:
        if response.status_code != 200:
            return {"kind": kind, "status": response.status_code, "body": (await response.aread()).decode()[:300]}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                return {"kind": kind, "status": 200, "error": data["error"]}
            chunks += 1
            first = first or time.monotonic() - sent
            for choice in data.get("choices") or ():
                finish = choice.get("finish_reason") or finish
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            if kind == "cancel" and chunks == 3:
                return {"kind": kind, "status": 200, "chunks": chunks}   # leaves: the stream is closed here
    return {"kind": kind, "status": 200, "finish": finish, "tokens": tokens, "ttft": first}


async def _load(base: str) -> list[dict[str, Any]]:
    rng = random.Random(14)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def limited(client: httpx.AsyncClient, i: int) -> dict[str, Any]:
        async with gate:
            return await _one(client, base, i, rng)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=CONCURRENCY * 2)) as client:
        return await asyncio.gather(*(limited(client, i) for i in range(NUM_REQUESTS)))


def test_load_through_the_router_with_cancelling_clients_leaves_nothing_on_the_replicas(
        kube: Any, cluster: tuple, timings: dict[str, float]) -> None:
    ns, operator = cluster
    eventually(lambda: len(ready_pods(kube, ns, "routed")) == 2, 240, "two ready replicas", 0.5)
    replicas = replica_urls(kube, ns, "routed")
    [pod] = eventually(lambda: [p for p in router_pods(kube, ns, "routed") if told(p) == replicas] or None, 30,
                       "the router told both replicas", 0.3)
    router_url = f"http://{pod['status']['podIP']}:8080"
    eventually(lambda: total(metrics(router_url), "kubeinfer_router_replicas_up") == 2, 30, "both replicas up")
    before = {url: metrics(url) for url in replicas}
    router_before = metrics(router_url)

    peak_kv = {url: 0.0 for url in replicas}
    done = threading.Event()

    def sample_kv() -> None:   # the KV cache must really fill during the load, or "back to 0" shows nothing
        while not done.wait(0.2):
            for url in replicas:
                with contextlib.suppress(httpx.HTTPError):
                    peak_kv[url] = max(peak_kv[url], total(metrics(url), "kubeinfer_kv_cache_usage_ratio"))
    sampler = threading.Thread(target=sample_kv, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        results = asyncio.run(_load(service_url(kube, ns, "routed-router")))
    finally:
        done.set()
        sampler.join(10)
    seconds = time.monotonic() - started
    timings[f"router load: {NUM_REQUESTS} requests, {CONCURRENCY} at a time, 1 in {CANCEL_EVERY} streams "
            f"cancelled (s)"] = seconds
    assert all(peak_kv.values()), peak_kv

    failed = [r for r in results if r["status"] not in (200, None) and r["kind"] != "abandon"]
    assert not failed, failed   # no 5xx (nor 4xx): the load is under every cap
    broken = [r for r in results if r.get("error")]
    assert not broken, broken   # no stream ended with an error event
    whole = [r for r in results if r["kind"] == "whole"]
    assert whole and all(r["finish"] == "length" and r["tokens"] == MAX_TOKENS for r in whole), whole
    assert all(r["chunks"] == 3 for r in results if r["kind"] == "cancel")

    # Nothing left behind: every replica back to no request and no KV block held; the router holds nothing.
    def idle(url: str) -> bool:
        m = metrics(url)
        return (total(m, "kubeinfer_num_requests_running"), total(m, "kubeinfer_num_requests_waiting"),
                total(m, "kubeinfer_kv_cache_usage_ratio")) == (0, 0, 0)
    for url in replicas:
        eventually(lambda: idle(url), 30, f"{url} idle with an empty KV cache", 0.3)
    after = {url: metrics(url) for url in replicas}
    router_after = metrics(router_url)
    assert total(router_after, "kubeinfer_router_requests_in_flight") == 0
    refused = "kubeinfer_router_refused_total"
    assert total(router_after, refused) == total(router_before, refused)

    def rise(name: str, **labels: str) -> dict[str, float]:
        return {u: total(after[u], name, **labels) - total(before[u], name, **labels) for u in replicas}
    aborted = sum(rise("kubeinfer_request_success_total", finished_reason="abort").values())
    served = rise("kubeinfer_request_success_total")
    finished = sum(served.values())
    left = len([r for r in results if r["kind"] != "whole"])
    # Every request reached a replica and ended there, and the ones the clients left were aborted (a request
    # that finished its 48 tokens just before its client left counts as finished instead).
    assert finished == NUM_REQUESTS, (finished, served)
    assert 0 < aborted <= left, (aborted, left)
    assert all(served.values()), served   # both replicas took part
    picks = {k: v - router_before.get(k, 0) for k, v in router_after.items()
             if k.startswith("kubeinfer_router_picks_total")}
    ttfts = sorted(r["ttft"] for r in whole)
    generated = sum(rise("kubeinfer_generation_tokens_total").values())
    print(f"\nrouter load: {len(whole)} whole streams, {left} left by their clients, {aborted:g} aborted on the "
          f"replicas, per replica {served}, peak KV use {peak_kv}, picks {picks}")
    timings["router load: requests aborted on the replicas after their client left"] = aborted
    timings["router load: TTFT P50 of the whole streams (s)"] = ttfts[len(ttfts) // 2]
    timings["router load: TTFT P95 of the whole streams (s)"] = ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))]
    timings["router load: tokens generated per second (replicas' counters)"] = generated / seconds


def test_a_request_at_the_operators_router_scales_from_zero_without_router_metrics_url(
        kube: Any, cluster: tuple, timings: dict[str, float]) -> None:
    ns, operator = cluster
    create(kube, ns, "zero", {**SPEC, "replicas": 0, "router": {"queueTimeoutSeconds": 180},
                              "autoscaling": {"minReplicas": 0, "maxReplicas": 1, "metricWindowSeconds": 5,
                                              "scaleToZeroIdleSeconds": 10, "scaleDownStabilizationSeconds": 0,
                                              "initialDelaySeconds": 0}})
    [pod] = eventually(lambda: [p for p in router_pods(kube, ns, "zero")
                                if told(p) == [] and condition(p, "Ready").get("status") == "True"] or None,
                       120, "the router Ready, told there is no replica", 0.3)
    time.sleep(3)   # autoscaler passes with nobody waiting: zero stays zero
    assert kube.get(isvc_path(ns, "zero"))["spec"]["replicas"] == 0 and not pods_of(kube, ns, "zero")
    base = service_url(kube, ns, "zero-router")
    assert [m["id"] for m in httpx.get(base + "/models", timeout=5).json()["data"]] == ["zero"]
    sent = time.monotonic()
    result = streams.stream_completion(streams.client(base, timeout_s=180), "zero", "Kubernetes is", 16)
    assert result.whole(16), (result, operator.output()[-3000:])
    timings["router (operator's): scale from zero, request -> first token"] = result.first_token_s or 0.0
    timings["router (operator's): scale from zero, request -> whole answer"] = time.monotonic() - sent
    obj = kube.get(isvc_path(ns, "zero"))
    [event] = [e for e in obj["status"]["scalingHistory"]["events"] if e["from"] == 0 and e["to"] == 1]
    assert event["reason"] == "ScaleFromZero", event
    eventually(lambda: kube.get(isvc_path(ns, "zero"))["spec"]["replicas"] == 0, 90, "back to 0", 0.5)
    eventually(lambda: told(router_pods(kube, ns, "zero")[0]) == [], 120, "the router told: no replica", 0.5)
    # Turned off: the router goes, the endpoint goes back to the replicas' Service.
    kube.request("PATCH", isvc_path(ns, "zero"), body={"spec": {"router": {"enabled": False}}},
                 content_type="application/merge-patch+json")
    eventually(lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/zero-router") is None, 30,
               "the router's Deployment deleted", 0.5)
    eventually(lambda: kube.get(isvc_path(ns, "zero"))["status"]["endpoint"] == f"http://zero.{ns}.svc/v1", 30,
               "status.endpoint back to the replicas' Service", 0.5)
    assert kube.get(f"/api/v1/namespaces/{ns}/services/zero-router") is None
    assert "Traceback" not in operator.output()


def test_a_stream_goes_on_when_its_replica_pod_is_killed(kube: Any, cluster: tuple) -> None:
    """Through the router's Service, a greedy stream of 1,200 tokens (long enough to outlive the kill); its
    replica's pod is deleted with no grace (SIGKILL) after a few chunks: the official client's stream goes on to the end from the other replica, with the text of an
    uninterrupted run, one id, no error."""
    ns, operator = cluster
    create(kube, ns, "resumed", {**SPEC, "replicas": 2, "router": {}})
    eventually(lambda: len(ready_pods(kube, ns, "resumed")) == 2, 240, "two ready replicas", 0.5)
    want = replica_urls(kube, ns, "resumed")
    eventually(lambda: [p for p in router_pods(kube, ns, "resumed")
                        if told(p) == want and condition(p, "Ready").get("status") == "True"] or None,
               60, "a Ready router pod told both replicas", 0.3)
    base = service_url(kube, ns, "resumed-router")
    ask = {"model": "resumed", "prompt": "Kubernetes schedules pods onto nodes and", "max_tokens": 1200,
           "temperature": 0, "extra_body": {"ignore_eos": True}}
    api = streams.client(base)
    expected = "".join(chunk.choices[0].text for chunk in api.completions.create(stream=True, **ask))
    pods_by_url = {f"http://{p['status']['podIP']}:8000": p["metadata"]["name"] for p in ready_pods(kube, ns, "resumed")}
    raw = api.completions.with_streaming_response.create(stream=True, **ask)
    with raw as response:
        victim = pods_by_url[response.headers["x-kubeinfer-replica"]]
        chunks = []
        for chunk in response.parse():
            chunks.append(chunk)
            if len(chunks) == 5:
                kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{victim}", body={"gracePeriodSeconds": 0})
    assert victim not in {p["metadata"]["name"] for p in pods_of(kube, ns, "resumed")}   # killed mid-stream
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert len({c.id for c in chunks}) == 1 and chunks[-1].choices[0].finish_reason == "length"
    router_url = f"http://{router_pods(kube, ns, 'resumed')[0]['status']['podIP']}:8080"
    assert total(metrics(router_url), "kubeinfer_router_resumes_total", outcome="resumed") == 1
    assert "Traceback" not in operator.output()
