"""Faults of the service's own pods under steady load through the router (docs/e2e.md, "Chaos suite"): a replica
pod deleted (it drains), a replica pod force-deleted (gracePeriodSeconds 0: the kubelet gives its container 2 s, then
SIGKILL, so the streams of 1,024 tokens it holds are cut), a router pod deleted, and the engine process killed inside
a replica pod (its container restarts). Each: nothing lost, and the service back at its replica count.
"""
from __future__ import annotations

import pytest

from support.chaos_scene import (
    KILL_ENGINE, MAX_TOKENS, Scene, assert_nothing_lost, busiest_replica, restarts, run_fault,
)
from support.cluster import eventually
from support.kubectl import exec_in
from support.pod_log import LogTail
from support.router_view import router_pods

pytestmark = pytest.mark.chaos


def delete_pod(scene: Scene, name: str, grace_s: int | None = None) -> None:
    body = {} if grace_s is None else {"gracePeriodSeconds": grace_s}
    scene.kube.request("DELETE", f"/api/v1/namespaces/{scene.ns}/pods/{name}", body=body)


@pytest.mark.parametrize("grace", ["deleted", "force-deleted"])
def test_a_replica_pod_deleted_or_force_deleted_under_load_loses_nothing(scene: Scene, grace: str) -> None:
    victim = {}

    def inject() -> None:
        victim["pod"] = busiest_replica(scene)["metadata"]["name"]
        # What the victim held when its drain began, from its own log (gone from the API with the pod).
        victim["log"] = LogTail(scene.kube, scene.ns, victim["pod"]).start()
        delete_pod(scene, victim["pod"], 0 if grace == "force-deleted" else None)
    what = ("kubectl delete pod (grace as the pod sets: drained)" if grace == "deleted" else
            "gracePeriodSeconds 0 (preStop cut to 1 s, SIGTERM, SIGKILL 2 s later)")
    # Streams of 1,024 tokens outlive the 3 s a force-deleted pod is given (1 s of preStop, then 2 s).
    try:
        row = run_fault(scene, f"replica pod {grace}", f"one of 2 replica pods: {what}", inject,
                        max_tokens=1024 if grace == "force-deleted" else MAX_TOKENS)
    finally:
        if "log" in victim:
            victim["log"].stop()
    held, drained = victim["log"].in_flight_at_sigterm(), victim["log"].drained()
    print(f"\nchaos: the victim held {held} requests at SIGTERM; drained before it ended: {drained}")
    row["victim_held"] = held
    assert_nothing_lost(row)
    assert held is not None, "the victim's log never said its drain began (no SIGTERM seen)"
    if grace == "deleted":
        assert drained, "a pod deleted with its grace period must finish what it holds"
    elif held and not drained:   # its SIGKILL cut streams: the routers carried them on elsewhere
        assert row["resumed"] + row["retried"] > 0, row


def test_a_router_pod_deleted_under_load_loses_nothing(scene: Scene) -> None:
    def inject() -> None:
        delete_pod(scene, router_pods(scene.kube, scene.ns, scene.name)[0]["metadata"]["name"])
    row = run_fault(scene, "router pod deleted", "one of 2 router pods: kubectl delete pod", inject)
    assert_nothing_lost(row)


def test_the_engine_process_killed_inside_a_replica_pod_loses_nothing(scene: Scene) -> None:
    victim = {}

    def inject() -> None:
        pod = busiest_replica(scene)
        victim["name"] = pod["metadata"]["name"]
        victim["restarts"] = pod["status"]["containerStatuses"][0]["restartCount"]
        exec_in(scene.ns, victim["name"], "runtime", KILL_ENGINE)
        # In place once the kubelet saw the container exit (the API process follows its engine).
        eventually(lambda: restarts(scene, victim["name"]) > victim["restarts"], 120, "the container restarted", 0.2)
    row = run_fault(scene, "engine process killed", "kubectl exec: kill -9 of the engine process in a replica pod",
                    inject)
    # The API process exits when its engine dies: the kubelet restarts the container, the pod stays.
    assert restarts(scene, victim["name"]) == victim["restarts"] + 1
    assert_nothing_lost(row)
    assert row["failed"] == 0, row["problems"][:5]   # the streams on the dead engine were resumed, not failed
    assert row["resumed"] + row["retried"] > 0, row
