"""The two pools of `spec.disaggregation` (prefill and decode): their names, labels, the spec each pool's
Deployment is built from, and the `kubeinfer serve` flags of each role. Pure; builders and the status use it.

Policy, decided here (docs/disaggregation.md, "The operator", argues it):
- Each pool is a Deployment, `NAME-prefill` and `NAME-decode`, built as the colocated Deployment `NAME` is, from
  the spec with the pool's replicas and resources. Its pods carry the InferenceService's label (so the Service
  `NAME`, the PDB, the ServiceMonitor and the operator's pod watch take them as they take colocated replicas) and
  `kubeinfer.dev/pool: prefill|decode`, which each pool's Deployment selects on and which the ServiceMonitor copies
  onto the scraped series as the label `pool` (the autoscaler reads each pool apart by it).
- Prefill pods run `--kv-role prefill --kv-port P` and declare the KV port (`kv`); decode pods run `--kv-role
  decode`, and take KV only from sources inside `--kv-source-networks`: the operator's `podNetworks` setting (the
  cluster's pod CIDRs) when it is set, else the runtime's default (the private networks and loopback, which hold
  the pod IPs of ordinary clusters). The router alone names a KV source: it drops the field from clients' bodies;
  a client reaching a decode pod directly (the Service `NAME`) could name one, so where clients are not trusted a
  NetworkPolicy should keep them off the replicas' port (docs/disaggregation.md), or the hints be signed:
  with `kvSourceKeySecretRef`, decode pods and the router mount that Secret key and run `--kv-source-key-file`.
- The colocated Deployment `NAME` and the pools' never both exist: turning disaggregation on deletes `NAME`,
  turning it off deletes the pools' (reconcile.controller).
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import pod
from kubeinfer.operator.spec import GROUP, POOLS, InferenceServiceSpec
from kubeinfer.operator.spec.disaggregation import KvSourceKeyRef

POOL_LABEL = f"{GROUP}/pool"
POOL_SERIES_LABEL = "pool"   # the label the scraped series carry (ServiceMonitor relabeling)
KV_PORT_NAME = "kv"


def pool_name(owner_name: str, role: str) -> str:
    assert role in POOLS, role
    return f"{owner_name}-{role}"


def pool_spec(spec: InferenceServiceSpec, role: str) -> InferenceServiceSpec:
    """The spec a pool's Deployment is built from: the service's, with the pool's replicas, resources and
    autoscaling, and no disaggregation (a pool is a fleet of one role)."""
    assert spec.disaggregation is not None
    pool = spec.disaggregation.pool(role)
    return spec.model_copy(update={
        "replicas": pool.desired_replicas, "resources": pool.resources or spec.resources,
        "autoscaling": pool.autoscaling, "disaggregation": None})


def kv_args(spec: InferenceServiceSpec, role: str, config: OperatorConfig) -> list[str]:
    """The `kubeinfer serve` flags of a pool's role (after the rest: runtime.extraArgs may not set them)."""
    assert spec.disaggregation is not None
    if role == "prefill":
        return ["--kv-role", "prefill", "--kv-port", str(spec.disaggregation.kv_port)]
    networks = ["--kv-source-networks", ",".join(config.pod_networks)] if config.pod_networks else []
    signed = ["--kv-source-key-file", pod.KV_SOURCE_KEY_FILE] if kv_source_key_ref(spec) is not None else []
    return ["--kv-role", "decode", *networks, *signed]


def kv_source_key_ref(spec: InferenceServiceSpec) -> KvSourceKeyRef | None:
    """The Secret key that signs KV-source hints (None: unsigned, or not disaggregated)."""
    return spec.disaggregation.kv_source_key_secret_ref if spec.disaggregation is not None else None


def kv_source_key_volume(spec: InferenceServiceSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (volume, mount) of the signing key, for the decode pods and the router; None for unsigned hints."""
    ref = kv_source_key_ref(spec)
    return None if ref is None else pod.secret_file("kv-source-key", ref.name, ref.key, pod.KV_SOURCE_KEY_FILE)


def kv_container_port(spec: InferenceServiceSpec) -> dict[str, Any]:
    assert spec.disaggregation is not None
    return {"name": KV_PORT_NAME, "containerPort": spec.disaggregation.kv_port, "protocol": "TCP"}


def role_of(pod: dict[str, Any]) -> str | None:
    """The pool a replica pod belongs to (None: a colocated replica)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)


def pods_of(pods: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [p for p in pods if role_of(p) == role]
