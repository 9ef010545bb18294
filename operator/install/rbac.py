"""The operator's least-privilege RBAC rules, kept in this one place.

Print them as a ClusterRole with ``python -m kubeinfer.operator.rbac`` (the Helm chart renders the same).
Every verb below is used by the code. Children go away by garbage collection; the one deletion is of a router
that `spec.router` no longer asks for (its Deployment and Service).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from kubeinfer.operator.spec import GROUP, PLURAL

RULES: list[dict[str, Any]] = [
    # The custom resource: watched by kopf, annotated by kopf (last-handled spec), status written by us.
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]},
    # Children: read to compare, server-side apply (patch), create where a server does not create on apply.
    # Delete: a router turned off.
    {"apiGroups": ["apps"], "resources": ["deployments"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"],
     "verbs": ["get", "list", "watch", "create", "patch"]},
    {"apiGroups": ["monitoring.coreos.com"], "resources": ["servicemonitors"], "verbs": ["get", "create", "patch"]},
    # spec.inferencePool (Gateway API Inference Extension); delete: the field removed.
    {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
     "verbs": ["get", "create", "patch", "delete"]},
    # Pods: read, to explain failures (image pulls, crash loops, unschedulable) in status; patch, only annotations:
    # the router pods' list of ready replicas (reconcile.router), the replica pods' adapters-list hash, whose change
    # makes the kubelet refresh their mounted adapters list at once (reconcile.lora.sync).
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
    # LoRA: the adapters' list each InferenceService's pods mount (a child, applied as the others are). No Secret
    # is read: the replicas follow the list themselves and report on an open endpoint (reconcile.lora.sync); the
    # Secrets services name are mounted by the kubelet, which needs no rule of ours.
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    # Events: ours (condition changes, scaling; patch: a repeat raises the count of the first, operator.events)
    # and kopf's warnings/errors.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    # kopf: peering (two copies never act at once), discovery of namespaces and CRDs.
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings", "kopfpeerings"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
]


def cluster_role(name: str = "kubeinfer-operator") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": RULES}


def main() -> None:
    sys.stdout.write(yaml.safe_dump(cluster_role(), sort_keys=False))


if __name__ == "__main__":
    main()
