"""Which child events make a pass (operator/reconcile/child_view.py): an event showing nothing a pass has not seen
makes none. Pure tests of the view, then the operator on kmock."""
from __future__ import annotations

import copy
from typing import Any

from kubeinfer.operator.reconcile.child_view import ChildView, digest
from support.operator_harness import NAMESPACE, child_path, isvc_path, settle

PDB = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
       "metadata": {"name": "qwen", "namespace": "default", "uid": "u-pdb", "resourceVersion": "7",
                    "managedFields": [{"manager": "kubeinfer"}]},
       "spec": {"maxUnavailable": 1}, "status": {"currentHealthy": 1, "disruptionsAllowed": 1}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"name": "qwen", "namespace": "default", "uid": "u-dep", "resourceVersion": "3"},
              "spec": {"replicas": 2}, "status": {"replicas": 2, "readyReplicas": 1}}


def changed(obj: dict, **paths: Any) -> dict:
    out = copy.deepcopy(obj)
    for path, value in paths.items():
        *parents, last = path.split("__")
        target = out
        for key in parents:
            target = target[key]
        target[last] = value
    return out


def test_the_digest_leaves_out_what_every_write_changes_and_the_status_no_pass_reads():
    assert digest(changed(PDB, metadata__resourceVersion="8", metadata__managedFields=[])) == digest(PDB)
    assert digest(changed(PDB, status__currentHealthy=2, status__disruptionsAllowed=2)) == digest(PDB)
    assert digest(changed(PDB, spec__maxUnavailable=0)) != digest(PDB)   # a hand edit: the pass repairs it
    assert digest(changed(DEPLOYMENT, status__readyReplicas=2)) != digest(DEPLOYMENT)   # status feeds ours
    assert digest(changed(DEPLOYMENT, metadata__annotations={"a": "b"})) != digest(DEPLOYMENT)


def test_an_event_is_news_once_and_a_deletion_always():
    view = ChildView()
    assert view.is_news("ADDED", PDB)
    assert not view.is_news("MODIFIED", changed(PDB, metadata__resourceVersion="9", status__currentHealthy=0))
    assert view.is_news("MODIFIED", changed(PDB, spec__maxUnavailable=0))
    assert view.is_news("DELETED", PDB) and view.is_news("ADDED", PDB)   # recreated: news again
    view.saw(DEPLOYMENT)   # a pass wrote it: its echo is no news, the next status is
    assert not view.is_news("MODIFIED", DEPLOYMENT)
    assert view.is_news("MODIFIED", changed(DEPLOYMENT, status__readyReplicas=2))
    assert view.is_news(None, {"metadata": {}})   # no name: cannot tell, so news
    assert not view.is_news("MODIFIED", {k: v for k, v in PDB.items() if k != "kind"}, "PodDisruptionBudget")


NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)


def passes(requests: list[Any]) -> int:
    """Reconcile passes: each reads the InferenceService once (kopf's own watch and list aside)."""
    return sum(1 for r in requests if r.method == "GET" and r.name == NAME and r.resource is not None
               and r.resource.plural == "inferenceservices" and r.params.get("watch") != "true")


async def test_a_pdb_status_change_makes_no_pass_and_a_hand_edit_does(operator: Any, kapi: Any) -> None:
    await kapi.create(isvc_path(NAMESPACE), {
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen", "generation": 1},
        "spec": {"model": {"uri": "pvc://models/qwen"}}})
    await kapi.eventually(ISVC, lambda o: (o.get("status") or {}).get("conditions"))
    await settle(operator)

    start = len(list(operator))
    for healthy in range(1, 4):   # the disruption controller's updates as pods come and go
        await kapi.patch(child_path("PodDisruptionBudget", NAMESPACE, NAME),
                         {"status": {"currentHealthy": healthy, "disruptionsAllowed": healthy}})
        await settle(operator)
    assert passes(list(operator)[start:]) == 0

    start = len(list(operator))
    await kapi.patch(child_path("PodDisruptionBudget", NAMESPACE, NAME), {"spec": {"maxUnavailable": 5}})
    await settle(operator)
    assert passes(list(operator)[start:]) >= 1, "a hand edit of a child must still make a pass"
    pdb = await kapi.get(child_path("PodDisruptionBudget", NAMESPACE, NAME))
    assert pdb["spec"].get("maxUnavailable") != 5, "the pass put the PDB back as the spec says"
