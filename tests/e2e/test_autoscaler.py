"""The autoscaler for real: pods of the runtime image on a real node, Debian's Prometheus finding them through
the API server (HTTP service discovery with the labels of kubernetes_sd's pod role: Debian builds
Prometheus without kubernetes_sd_configs) and scraping their /metrics, and `kubeinfer operator` reading
Prometheus.

A bounded load (8 streams kept in flight, 2 run per pod) builds a queue → the autoscaler raises
spec.replicas → the new pod turns Ready and serves requests (its own counters) → the load stops → after the
scale-down window spec.replicas falls back, while a trickle of streams runs and none is cut. Deleting the
autoscaled InferenceService then releases kopf's finalizer and garbage-collects the children.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import PROMETHEUS_BIN, Prometheus, streams
from support.pod_discovery import PodDiscovery, scrape_config
from support.cluster import (
    OperatorProcess, condition, eventually, isvc_path, namespace_scene,
    pod_counter, pods_of, ready_pods, service_url, start_operator,
)

NAME = "scaled"
LOAD_STREAMS, LOAD_TOKENS, LOAD_LIMIT_S = 8, 300, 240
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2, "targetQueueDepthPerReplica": 2, "metricWindowSeconds": 10,
               "scaleDownStabilizationSeconds": 15, "initialDelaySeconds": 0}


class Load:
    """`count` streams kept in flight through the Service until stopped or `limit_s` passed (self-stopping)."""

    def __init__(self, url: str, count: int, max_tokens: int, limit_s: float, pause_s: float = 0.0):
        self.stop, self.results, self._lock = threading.Event(), [], threading.Lock()
        self.pause_s = pause_s
        self.deadline = time.monotonic() + limit_s
        self.max_tokens = max_tokens
        self._threads = [threading.Thread(target=self._loop, args=(url,), daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _loop(self, url: str) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            with streams.client(url) as api:   # a new connection each time: the Service spreads connections
                result = streams.stream_completion(api, NAME, "load", self.max_tokens)
            with self._lock:
                self.results.append(result)
            self.stop.wait(self.pause_s)

    def finish(self, timeout_s: float = 120) -> list[streams.StreamResult]:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        assert not any(t.is_alive() for t in self._threads)
        return self.results

    def cut(self) -> list[streams.StreamResult]:
        return [r for r in self.results if not r.whole(self.max_tokens)]


@pytest.fixture(scope="module")
def setup(kube: Any, crds: None, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    if PROMETHEUS_BIN is None:
        pytest.skip("prometheus binary not found (apt-get install -y prometheus)")
    work: Path = tmp_path_factory.mktemp("autoscaler")
    with namespace_scene(kube) as (ns, stack):
        discovery = PodDiscovery(kube, ns)
        stack.callback(discovery.stop)
        prometheus = Prometheus(work / "prometheus", [scrape_config(discovery.url)])
        stack.callback(prometheus.stop)
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image, env={
            "KUBEINFER_PROMETHEUS_URL": prometheus.url, "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "2"}))
        yield ns, prometheus, operator


def test_load_scales_up_the_new_pod_serves_and_the_fleet_scales_down_with_no_stream_cut(
        kube: Any, setup: tuple, timings: dict[str, float]) -> None:
    ns, prometheus, operator = setup
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": NAME, "namespace": ns},
        "spec": {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
                 "runtime": {"imagePullPolicy": "IfNotPresent", "maxNumSeqs": 2, "drainTimeoutSeconds": 60},
                 "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "autoscaling": AUTOSCALING}})
    [first] = eventually(lambda: ready_pods(kube, ns, NAME), 180, "the first pod Ready", 0.2)
    selector = f'{{namespace="{ns}",service="{NAME}"}}'
    prometheus.wait_until(f"count(kubeinfer_num_requests_waiting{selector})", 1, rounds=60)
    eventually(lambda: condition(kube.get(isvc_path(ns, NAME)), "MetricsAvailable").get("status") == "True", 60,
               "the autoscaler reading Prometheus")
    assert kube.get(isvc_path(ns, NAME))["spec"]["replicas"] == 1

    # Load: the queue grows on the one pod, the autoscaler asks for a second.
    url = service_url(kube, ns, NAME)
    load, started = Load(url, LOAD_STREAMS, LOAD_TOKENS, LOAD_LIMIT_S), time.monotonic()
    try:
        obj = eventually(lambda: (o := kube.get(isvc_path(ns, NAME)))["spec"].get("replicas") == 2 and o, 180,
                         "spec.replicas raised to 2", 0.2)
        decided = time.monotonic()
        [event] = [e for e in obj["status"]["scalingHistory"]["events"] if e["to"] == 2]
        assert event["from"] == 1 and event["reason"] == "ScaleUp", event
        # What it answered: the queue the load built, as Prometheus saw it. Asked again for a few seconds: the
        # operator can act on a sample newer than the last whole second of the subquery's grid (seen: the
        # decision read a queue of 6, the peak query made 0.2 s later still said 1).
        peak = f"max_over_time(sum(kubeinfer_num_requests_waiting{selector})[5m:1s])"
        peak_queue = eventually(lambda: (q := prometheus.scalar(peak)) is not None
                                and q > AUTOSCALING["targetQueueDepthPerReplica"] and q, 10,
                                "Prometheus's peak queue above the target", 0.5)
        new = eventually(lambda: next((p for p in ready_pods(kube, ns, NAME) if p["metadata"]["name"]
                                       != first["metadata"]["name"]), None), 180, "the new pod Ready", 0.1)
        new_ready = time.monotonic()
        eventually(lambda: pod_counter(new) > 0, 120, "a request served by the new pod", 0.1)
        new_served = time.monotonic()
    finally:
        load.finish()
    stopped = time.monotonic()
    assert load.cut() == [], load.cut()[:3]
    timings["autoscaler: load start -> spec.replicas 1 -> 2"] = decided - started
    timings["autoscaler: peak queue seen by Prometheus (requests)"] = peak_queue
    timings["autoscaler: decision -> new pod Ready"] = new_ready - decided
    timings["autoscaler: new pod Ready -> first request served on it"] = new_served - new_ready
    timings["autoscaler: load streams completed, none cut (count)"] = len(load.results)

    # No load but a trickle (one short stream every ~6 s, well under one replica's capacity): after the
    # window, back to 1, and the pod that goes drains its streams.
    trickle = Load(url, 1, 64, LOAD_LIMIT_S, pause_s=6.0)
    try:
        eventually(lambda: kube.get(isvc_path(ns, NAME))["spec"]["replicas"] == 1, 180, "spec.replicas back to 1")
        down = time.monotonic()
        eventually(lambda: len(pods_of(kube, ns, NAME)) == 1, 180, "the second pod gone", 0.5)
        gone = time.monotonic()
        time.sleep(2)
    finally:
        trickle.finish()
    assert trickle.results and trickle.cut() == [], trickle.cut()[:3]
    timings["autoscaler: load stopped -> spec.replicas 2 -> 1"] = down - stopped
    timings["autoscaler: scale-down decision -> pod gone (drained)"] = gone - down
    timings["autoscaler: trickle streams during scale-down, none cut (count)"] = len(trickle.results)
    events = kube.list(f"/api/v1/namespaces/{ns}/events")
    reasons = [e["reason"] for e in events if e["involvedObject"].get("name") == NAME
               and e["involvedObject"].get("kind") == "InferenceService"]
    assert "ScaleUp" in reasons and "ScaleDown" in reasons, reasons
    assert "Traceback" not in operator.output()


def test_deleting_the_autoscaled_service_releases_the_finalizer_and_collects_children(
        kube: Any, setup: tuple) -> None:
    ns, _, _ = setup
    assert "kubeinfer.dev/finalizer" in kube.get(isvc_path(ns, NAME))["metadata"]["finalizers"]
    kube.request("DELETE", isvc_path(ns, NAME))
    eventually(lambda: kube.get(isvc_path(ns, NAME)) is None, 60, "the InferenceService gone (finalizer released)")
    eventually(lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}") is None, 60, "GC")
    eventually(lambda: not pods_of(kube, ns, NAME), 120, "its pods gone")
