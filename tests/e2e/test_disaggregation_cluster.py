"""`spec.disaggregation` on a real cluster (issue #29's Must-show): at the same number of pods, 2 colocated replicas
against 1 prefill + 1 decode replica of the CPU demo model, both behind the operator's router, the inter-token
latency P99 of running streams while long prompts keep arriving, and the time to first token the KV transfer adds.

One InferenceService is measured colocated (`replicas: 2`), then switched to `disaggregation` (which also shows the
switch: the Deployment NAME goes, NAME-prefill and NAME-decode come, the router is told both pools), measured again,
and switched back. The figures are printed and go into the e2e report (`timings`).

Traffic goes only to the router's Service address, bounded: a fixed number of streams of a fixed length, and long
prompts sent one at a time only while those streams run (at most MAX_LONG_PROMPTS).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, namespace_scene, pods_of, service_url, start_operator,
)

NAME = "split"
POOL_LABEL = "kubeinfer.dev/pool"
ROUTER_LABEL = "kubeinfer.dev/router"
ENDPOINTS = ("kubeinfer.dev/router-endpoints", "kubeinfer.dev/router-prefill-endpoints")
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
        "runtime": {"imagePullPolicy": "IfNotPresent", "maxModelLen": 2048},
        "resources": {"gpus": 0, "cpu": "500m", "memory": "2Gi"}, "router": {"queueTimeoutSeconds": 120}}
# The load: streams of STREAM_TOKENS greedy tokens running while prompts of ~LONG_PROMPT_TOKENS arrive back to back.
NUM_STREAMS, STREAM_TOKENS, LONG_PROMPT_TOKENS, MAX_LONG_PROMPTS, IDLE_SAMPLES = 4, 96, 1000, 40, 3
REQUEST_TIMEOUT_S = 180   # the longest a request here may take on a loaded 2-core node: a bound, not a guess at speed
# Each long prompt starts differently, so that no replica's prefix cache (nor the decode side's reuse of its own)
# serves any of it: every one is a whole prefill, and with disaggregation a whole transfer.
ASKED = itertools.count()


def unique(long_prompt: str) -> str:
    return f"Question {next(ASKED)} of the run {time.time_ns()}: {long_prompt}"


@pytest.fixture(scope="module")
def cluster(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    work: Path = tmp_path_factory.mktemp("disaggregation")
    with namespace_scene(kube) as (ns, stack):
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image))
        yield ns, operator


def patch(kube: Any, ns: str, body: dict[str, Any]) -> None:
    kube.request("PATCH", isvc_path(ns, NAME), body=body, content_type="application/merge-patch+json")


def ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and condition(pod, "Ready").get("status") == "True"


def replica_urls(kube: Any, ns: str, pool: str | None) -> list[str]:
    """The ready replicas of one pool (None: the colocated ones, which carry no pool label)."""
    return sorted(f"http://{p['status']['podIP']}:8000" for p in pods_of(kube, ns, NAME)
                  if ready(p) and (p["metadata"].get("labels") or {}).get(POOL_LABEL) == pool)


def router_told(kube: Any, ns: str, decode: list[str], prefill: list[str] | None) -> dict[str, Any] | None:
    """The one router pod, Ready and told these replicas (prefill None: no prefill annotation wanted)."""
    pods = [p for p in kube.list(f"/api/v1/namespaces/{ns}/pods", f"{ROUTER_LABEL}={NAME}")
            if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != 1 or not ready(pods[0]):
        return None
    notes = pods[0]["metadata"].get("annotations") or {}
    told = [sorted(json.loads(notes[a])) if a in notes else None for a in ENDPOINTS]
    args = pods[0]["spec"]["containers"][0]["args"]
    wants_prefill = prefill is not None
    if told != [decode, prefill] or ("--prefill-endpoints-file" in args) != wants_prefill:
        return None
    return pods[0]


def metric(url: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        key, _, value = line.rpartition(" ")
        if line.startswith("#") or not (key == name or key.startswith(name + "{")):
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += float(value)
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _stream(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int) -> list[float]:
    """One greedy stream; the arrival time of each chunk that carries a choice (a token's text, which may be empty
    where a token ends inside a character)."""
    body = {"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}
    times: list[float] = []
    async with client.stream("POST", base + "/completions", json=body, timeout=REQUEST_TIMEOUT_S) as response:
        assert response.status_code == 200, (await response.aread()).decode()[:300]
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            assert "error" not in data, data
            if data.get("choices"):
                times.append(time.monotonic())
    return times


async def _measure(base: str, long_prompt: str) -> dict[str, float]:
    """TTFT of the long prompt on an idle service (median of IDLE_SAMPLES), then ITL P99 of NUM_STREAMS running
    streams while the long prompt is sent again and again, one at a time."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        idle = []
        for _ in range(IDLE_SAMPLES):
            sent = time.monotonic()
            times = await _stream(client, base, unique(long_prompt), 1)
            idle.append(times[0] - sent)
        streams = [asyncio.ensure_future(_stream(client, base, f"Stream {i}: Kubernetes schedules pods and",
                                                 STREAM_TOKENS)) for i in range(NUM_STREAMS)]
        long_ttfts: list[float] = []
        while not all(s.done() for s in streams) and len(long_ttfts) < MAX_LONG_PROMPTS:
            sent = time.monotonic()
            times = await _stream(client, base, unique(long_prompt), 1)
            long_ttfts.append(times[0] - sent)
        chunk_times = await asyncio.gather(*streams)
    gaps = [b - a for times in chunk_times for a, b in zip(times[1:], times[2:])]   # after the first token
    assert all(len(t) > STREAM_TOKENS // 2 for t in chunk_times), [len(t) for t in chunk_times]
    assert long_ttfts, "no long prompt arrived while the streams ran"
    return {"itl_p99": percentile(gaps, 0.99), "itl_p50": percentile(gaps, 0.5), "idle_ttft": statistics.median(idle),
            "loaded_ttft_p50": percentile(long_ttfts, 0.5), "long_prompts": len(long_ttfts)}


def _long_prompt(base: str) -> str:
    """A prompt of about LONG_PROMPT_TOKENS tokens of the demo model, sized from the tokens of a probe."""
    words = " ".join(f"topic{i} of the cluster" for i in range(40))
    probe = httpx.post(base + "/completions", json={"model": NAME, "prompt": words, "max_tokens": 1},
                       timeout=REQUEST_TIMEOUT_S)
    assert probe.status_code == 200, probe.text
    per_copy = probe.json()["usage"]["prompt_tokens"]
    prompt = " ".join([words] * max(1, LONG_PROMPT_TOKENS // per_copy))
    sized = httpx.post(base + "/completions", json={"model": NAME, "prompt": unique(prompt), "max_tokens": 1},
                       timeout=REQUEST_TIMEOUT_S)
    assert sized.status_code == 200, sized.text
    assert LONG_PROMPT_TOKENS // 2 <= sized.json()["usage"]["prompt_tokens"] <= 2000, sized.json()["usage"]
    return prompt


def test_itl_of_running_streams_colocated_against_disaggregated_at_the_same_pod_count(
        kube: Any, cluster: tuple, timings: dict[str, float]) -> None:
    ns, operator = cluster
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": ns}, "spec": {**SPEC, "replicas": 2}})
    eventually(lambda: len(replica_urls(kube, ns, None)) == 2, 300, "two colocated replicas ready", 0.5)
    eventually(lambda: router_told(kube, ns, replica_urls(kube, ns, None), None), 120,
               "the router Ready and told both replicas", 0.5)
    base = service_url(kube, ns, f"{NAME}-router")
    long_prompt = _long_prompt(base)
    colocated = asyncio.run(_measure(base, long_prompt))

    # The same two pods' worth, split: the colocated Deployment goes, one prefill and one decode replica come.
    started = time.monotonic()
    # Signed KV-source hints (issue #56): the router and the decode pod mount this key; the operator never reads it.
    kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kv-key"},
        "stringData": {"kv-source-key": secrets.token_hex(32)}})
    patch(kube, ns, {"spec": {"replicas": None, "disaggregation": {
        "prefill": {"replicas": 1}, "decode": {"replicas": 1}, "kvSourceKeySecretRef": {"name": "kv-key"}}}})
    eventually(lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}") is None, 60,
               "the colocated Deployment deleted", 0.5)
    eventually(lambda: len(replica_urls(kube, ns, "prefill")) == 1 and len(replica_urls(kube, ns, "decode")) == 1,
               300, "one prefill and one decode replica ready", 0.5)
    pod = eventually(lambda: router_told(kube, ns, replica_urls(kube, ns, "decode"), replica_urls(kube, ns, "prefill")),
                     120, "the router Ready and told both pools", 0.5)
    router_url = f"http://{pod['status']['podIP']}:8080"
    eventually(lambda: metric(router_url, "kubeinfer_router_prefill_replicas_up") == 1, 60,
               "the router sees the prefill replica's KV endpoint", 0.5)
    timings["disaggregation: colocated -> prefill and decode Ready, router told (s)"] = time.monotonic() - started
    obj = eventually(lambda: (o := kube.get(isvc_path(ns, NAME))) and condition(o, "Ready").get("reason") == "Available"
                     and o, 60, "Ready, Available", 0.5)
    pools = obj["status"]["disaggregation"]
    assert (pools["prefill"]["readyReplicas"], pools["decode"]["readyReplicas"]) == (1, 1), pools
    before = {path: metric(router_url, "kubeinfer_router_disaggregation_requests_total", path=path)
              for path in ("disaggregated", "fallback", "colocated")}
    split = asyncio.run(_measure(base, long_prompt))
    paths = {path: metric(router_url, "kubeinfer_router_disaggregation_requests_total", path=path) - n
             for path, n in before.items()}
    # Every request of the load went through a KV transfer, none fell back.
    assert paths["fallback"] == 0 and paths["colocated"] == 0 and \
        paths["disaggregated"] == IDLE_SAMPLES + NUM_STREAMS + split["long_prompts"], paths

    # Every transfer above was signed by the router; a client reaching the decode pod directly cannot name a source.
    [decode_url], [prefill_url] = replica_urls(kube, ns, "decode"), replica_urls(kube, ns, "prefill")
    source = prefill_url.removeprefix("http://").replace(":8000", ":9100")
    for extra in ({}, {"kubeinfer_kv_source_signature": "9999999999.00"}):
        refused = httpx.post(decode_url + "/v1/completions", timeout=REQUEST_TIMEOUT_S, json={
            "model": NAME, "prompt": "hi", "max_tokens": 1, "kubeinfer_kv_source": source, **extra})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "kubeinfer_kv_source_signature", refused.text

    figures = {
        f"disaggregation: ITL P99 of {NUM_STREAMS} running streams, ~{LONG_PROMPT_TOKENS}-token prompts arriving, "
        "2 colocated pods (s)": colocated["itl_p99"],
        "disaggregation: the same, 1 prefill + 1 decode pod (s)": split["itl_p99"],
        "disaggregation: ITL P50 of the running streams, colocated (s)": colocated["itl_p50"],
        "disaggregation: ITL P50 of the running streams, disaggregated (s)": split["itl_p50"],
        f"disaggregation: TTFT of a ~{LONG_PROMPT_TOKENS}-token prompt, idle, colocated (s)": colocated["idle_ttft"],
        f"disaggregation: TTFT of a ~{LONG_PROMPT_TOKENS}-token prompt, idle, disaggregated (s)": split["idle_ttft"],
        "disaggregation: TTFT the transfer adds (idle, disaggregated - colocated) (s)":
            split["idle_ttft"] - colocated["idle_ttft"],
        "disaggregation: long prompts' TTFT P50 under the load, colocated (s)": colocated["loaded_ttft_p50"],
        "disaggregation: long prompts' TTFT P50 under the load, disaggregated (s)": split["loaded_ttft_p50"],
    }
    timings.update(figures)
    print("\n" + "\n".join(f"{name}: {value:.4f}" for name, value in figures.items()))

    # And back: the pools go, the colocated Deployment comes back, the router forgets the prefill pool.
    patch(kube, ns, {"spec": {"disaggregation": None, "replicas": 2}})
    eventually(lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}-prefill") is None and
               kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}-decode") is None, 60,
               "the pools' Deployments deleted", 0.5)
    eventually(lambda: len(replica_urls(kube, ns, None)) == 2, 300, "two colocated replicas ready again", 0.5)
    eventually(lambda: router_told(kube, ns, replica_urls(kube, ns, None), None), 120,
               "the router told the colocated replicas only", 0.5)
    assert "disaggregation" not in kube.get(isvc_path(ns, NAME))["status"]
    assert "Traceback" not in operator.output()
