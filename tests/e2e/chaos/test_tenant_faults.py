"""A tenant floods while another tenant's streams are resumed (issue #56; docs/e2e.md, "Chaos suite"): the chaos
service of 2 replicas behind 2 router pods, with tenants (`spec.tenants`, fair scheduling, at most
MAX_IN_FLIGHT requests per tenant at the router). The victim tenant keeps VICTIM_CLIENTS streams of 1,024 tokens
going; the flooding tenant starts FLOOD_CLIENTS clients sending back to back (beyond its cap: most are refused with
429 at once, and try again), then the engine of the replica running the most requests is killed, so the victim's
streams there must be resumed on the other replica while the flood goes on.

The victim: nothing lost, nothing failed (its streams are resumed, not cut), every text that of an uninterrupted
stream. The flood: nothing lost either (each request completed or refused with an OpenAI error body).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.chaos_scene import (
    KILL_ENGINE, RECOVERY_LIMIT_S, SPEC, Scene, assert_nothing_lost, busiest_replica, create_service, restarts,
    run_fault,
)
from support.cluster import OperatorProcess, eventually, namespace_scene, start_operator
from support.kubectl import exec_in

pytestmark = pytest.mark.chaos
NAME = "chaos-tenants"
MAX_IN_FLIGHT, VICTIM_CLIENTS, FLOOD_CLIENTS = 3, 2, 8
KEYS = {"victim": "key-victim-0123456789", "flood": "key-flood-0123456789"}
TENANT_SPEC = {**SPEC, "tenants": {"secretRef": {"name": "tenant-keys", "key": "keys"},
                                   "maxInFlightPerTenant": MAX_IN_FLIGHT}}


@pytest.fixture(scope="module")
def tenant_scene(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    work: Path = tmp_path_factory.mktemp("chaos-tenants")
    with namespace_scene(kube) as (ns, stack):
        kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tenant-keys"},
            "stringData": {"keys": "".join(f"{key} tenant={tenant}\n" for tenant, key in KEYS.items())}})
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image))
        create_service(kube, ns, TENANT_SPEC, NAME)
        scene = Scene(kube, ns, operator, name=NAME, concurrency=VICTIM_CLIENTS, api_keys=[KEYS["victim"]])
        eventually(scene.serving, RECOVERY_LIMIT_S, "the tenants' service serving", 1)
        yield scene


def test_a_flood_while_another_tenants_streams_are_resumed_loses_nothing(tenant_scene: Scene) -> None:
    scene = tenant_scene
    flood = scene.load(1024, FLOOD_CLIENTS, [KEYS["flood"]])
    victim = {}

    def inject() -> None:
        # A flood request the cap admits streams beside at most MAX_IN_FLIGHT + VICTIM_CLIENTS - 1 others, where
        # the victim's warm-up ran VICTIM_CLIENTS: its bound is the victim's (derived from that warm-up) scaled by
        # that ratio of streams per step.
        flood.bound_s = scene.current_load.bound_s * (MAX_IN_FLIGHT + VICTIM_CLIENTS) / VICTIM_CLIENTS
        flood.start()
        pod = busiest_replica(scene)
        victim["name"], victim["restarts"] = pod["metadata"]["name"], pod["status"]["containerStatuses"][0][
            "restartCount"]
        exec_in(scene.ns, victim["name"], "runtime", KILL_ENGINE)
        eventually(lambda: restarts(scene, victim["name"]) > victim["restarts"], 120, "the container restarted", 0.2)

    try:
        row = run_fault(scene, "tenant flood while streams resume", f"tenant 'flood' with {FLOOD_CLIENTS} clients "
                        f"(cap {MAX_IN_FLIGHT} in flight) from the fault on; kill -9 of the engine of the replica "
                        f"running the most; tenant 'victim' {VICTIM_CLIENTS} streams of 1,024 tokens", inject,
                        max_tokens=1024)
    finally:
        outcomes = flood.finish() if flood._thread is not None else []
    counts = flood.counts()
    refused = sum(1 for o in outcomes if o.outcome == "failed" and o.detail.startswith("429"))
    row["flood"] = {"sent": len(outcomes), "completed": counts["completed"], "refused_429": refused,
                    "failed_otherwise": counts["failed"] - refused, "lost": counts["lost"]}
    print(f"\nchaos: the flood: {row['flood']}")
    assert_nothing_lost(row)
    assert row["failed"] == 0 and row["differs"] == 0, row["problems"][:5]
    assert row["resumed"] + row["retried"] > 0, row
    assert counts["lost"] == 0, [o.detail for o in outcomes if o.outcome == "lost"][:5]
    assert refused > 0, "the flood never reached its cap"
