"""Prometheus stopped under steady load through the router (docs/e2e.md, "Chaos suite"): the autoscaler's
missing-metrics guard holds the replica count, so no scale-down follows while the signals are gone, although the
light load (2 clients, which one replica serves) asks for one; once Prometheus is back, the scale-down comes.

An autoscaled service of 2 replicas, `minReplicas` 1: the policy never scales down while a replica is younger than
`initialDelaySeconds` (it counts as loading), so the fault starts before a scale-down can be due, and lasts until
well after one would have been (that age, plus the metric window, the stabilization and 3 passes).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from support import PROMETHEUS_BIN, Prometheus
from support.chaos_scene import RECOVERY_LIMIT_S, SPEC, Scene, assert_nothing_lost, create_service, run_fault
from support.cluster import OperatorProcess, condition, eventually, isvc_path, namespace_scene, pods_of, start_operator
from support.pod_discovery import PodDiscovery, scrape_config

pytestmark = pytest.mark.chaos
INTERVAL_S = 2
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2, "metricWindowSeconds": 10, "scaleDownStabilizationSeconds": 10,
               "initialDelaySeconds": 120, "targetQueueDepthPerReplica": 2}


@pytest.fixture(scope="module")
def autoscaled(kube: Any, crds: None, runtime_image: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Scene, Prometheus]]:
    if PROMETHEUS_BIN is None:
        pytest.skip("prometheus binary not found (apt-get install -y prometheus)")
    work: Path = tmp_path_factory.mktemp("chaos-prometheus")
    with namespace_scene(kube) as (ns, stack):
        discovery = PodDiscovery(kube, ns)
        stack.callback(discovery.stop)
        prometheus = Prometheus(work / "prometheus", [scrape_config(discovery.url)])
        stack.callback(prometheus.stop)
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image, env={
            "KUBEINFER_PROMETHEUS_URL": prometheus.url, "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": str(INTERVAL_S)}))
        create_service(kube, ns, {**SPEC, "autoscaling": AUTOSCALING})
        scene = Scene(kube, ns, operator, concurrency=2)
        eventually(scene.serving, RECOVERY_LIMIT_S, "the autoscaled service serving at 2 replicas", 1)
        yield scene, prometheus


def metrics_available(scene: Scene) -> bool:
    return condition(scene.kube.get(isvc_path(scene.ns, scene.name)), "MetricsAvailable").get("status") == "True"


def spec_replicas(scene: Scene) -> int:
    return scene.kube.get(isvc_path(scene.ns, scene.name))["spec"]["replicas"]


def test_prometheus_stopped_no_scale_down_follows_and_nothing_is_lost(autoscaled: tuple[Scene, Prometheus]) -> None:
    scene, prometheus = autoscaled
    eventually(lambda: metrics_available(scene), 120, "the autoscaler reading Prometheus", 1)
    seen: list[int] = []

    def inject() -> None:
        youngest = max(datetime.fromisoformat(p["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
                       for p in pods_of(scene.kube, scene.ns, scene.name))
        due = youngest + AUTOSCALING["initialDelaySeconds"]   # from here a scale-down may come, by the policy
        assert time.time() < due, "the replicas are already older than initialDelaySeconds: the test cannot show a hold"
        assert spec_replicas(scene) == 2
        prometheus.stop()
        hold_until = (due + AUTOSCALING["metricWindowSeconds"] + AUTOSCALING["scaleDownStabilizationSeconds"]
                      + 3 * INTERVAL_S)
        eventually(lambda: not metrics_available(scene), 30, "MetricsAvailable False", 0.5)
        while time.time() < hold_until:
            seen.append(spec_replicas(scene))
            time.sleep(1)
        prometheus.start_again()
    row = run_fault(scene, "Prometheus stopped", "Prometheus SIGTERMed until a scale-down would have been due, then "
                    "started again", inject, recovered=lambda: metrics_available(scene))
    assert seen and set(seen) == {2}, seen   # held while the metrics were gone
    assert_nothing_lost(row)
    # It was the guard: with the metrics back, the light load's scale-down comes.
    eventually(lambda: spec_replicas(scene) == 1, 120, "the scale-down once Prometheus is back", 1)
    assert "Traceback" not in scene.operator.output()
