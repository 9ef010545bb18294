"""What one reconcile pass reads, on kmock: every pass of every event pays it, 1,000 services over.

A pass of a service without a router reads the InferenceService, its three children, and its pods: the Deployment
once (the read of the apply step serves the status too), and the router's objects only in the first pass of the
process (they cannot appear without this operator making them).
"""

from __future__ import annotations

from typing import Any

from support.operator_harness import NAMESPACE, child_path, isvc_path, settle

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
DEPLOYMENT = child_path("Deployment", NAMESPACE, NAME)


def manifest() -> dict[str, Any]:
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen", "generation": 1},
            "spec": {"model": {"uri": "pvc://models/qwen"}}}


def reads_of(requests: list[Any], plural: str, name: str) -> int:
    return sum(1 for r in requests if r.method == "GET" and r.name == name and r.resource is not None
               and r.resource.plural == plural and r.params.get("watch") != "true")


async def test_a_child_event_pass_reads_the_deployment_once_and_no_router(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest())
    await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("conditions"))
    await settle(operator)
    first = list(operator)
    assert reads_of(first, "deployments", f"{NAME}-router") >= 1, "the first pass looks for a router to remove"

    start = len(first)
    for i in range(3):   # three child events, each a pass
        await kapi.patch(DEPLOYMENT, {"metadata": {"annotations": {"example.com/note": str(i)}}})
        await settle(operator)
    later = list(operator)[start:]
    passes = reads_of(later, "inferenceservices", NAME)
    assert passes >= 1, "the child events never reached the operator"
    assert reads_of(later, "deployments", NAME) == passes, "one read of the Deployment per pass"
    assert reads_of(later, "deployments", f"{NAME}-router") == 0
    assert reads_of(later, "services", f"{NAME}-router") == 0
