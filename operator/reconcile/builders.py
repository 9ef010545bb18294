"""Pure builders of the child objects of one InferenceService: Deployment, Service, PDB, ServiceMonitor.

Each returns a complete object, ready for server-side apply, carrying the owner reference, the
common labels and a hash annotation of its own content (see :mod:`kubeinfer.operator.reconcile.apply`).
The pod selector uses only the owner's name, so it never changes across spec updates
(a Deployment's selector is immutable).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import pod, pools
from kubeinfer.operator.reconcile.lora import fetch as lora_fetch
from kubeinfer.operator.spec import API_VERSION, GROUP, KIND, POOLS, InferenceServiceSpec

INSTANCE_LABEL = f"{GROUP}/inferenceservice"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubeinfer"
HASH_ANNOTATION = f"{GROUP}/desired-hash"
# The labels llm-d's well-lit paths select model-server pods by (an InferencePool's selector): a gateway
# that already routes llm-d's pods finds ours with the same selector.
LLMD_SERVING_LABEL = "llm-d.ai/inferenceServing"
LLMD_MODEL_LABEL = "llm-d.ai/model"
SERVICE_PORT = 80


@dataclasses.dataclass(frozen=True)
class Owner:
    """The identity of the InferenceService that owns the children."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Owner:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""))


def selector_labels(owner: Owner) -> dict[str, str]:
    return {INSTANCE_LABEL: owner.name}


def selector_string(owner: Owner) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(owner).items())


def common_labels(owner: Owner) -> dict[str, str]:
    return {
        **selector_labels(owner),
        "app.kubernetes.io/name": "kubeinfer-runtime",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": "inference",
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def label_value(text: str) -> str:
    """`text` as a valid label value: letters, digits, '-', '_', '.', at most 63, alphanumeric at both ends."""
    value = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in text)[:63]
    return value.strip("-_.")


def pod_labels(spec: InferenceServiceSpec, owner: Owner) -> dict[str, str]:
    return {**common_labels(owner), LLMD_SERVING_LABEL: "true",
            LLMD_MODEL_LABEL: label_value(served_name(spec, owner))}


def served_name(spec: InferenceServiceSpec, owner: Owner) -> str:
    return spec.model.served_name or owner.name


def endpoint(owner: Owner) -> str:
    """The in-cluster OpenAI base URL clients use."""
    return f"http://{owner.name}.{owner.namespace}.svc/v1"


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def content_hash(obj: dict[str, Any]) -> str:
    """A stable hash of an object's desired content (the hash annotation itself excluded)."""
    stripped = json.loads(json.dumps(obj))
    stripped.get("metadata", {}).get("annotations", {}).pop(HASH_ANNOTATION, None)
    return hashlib.sha256(json.dumps(stripped, sort_keys=True).encode()).hexdigest()[:16]


def _finish(api_version: str, kind: str, owner: Owner, body: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """`body` as a complete child: named `name` (default: the owner's), labelled, owned, hashed."""
    obj = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name or owner.name,
            "namespace": owner.namespace,
            "labels": common_labels(owner),
            "annotations": {},
            "ownerReferences": [owner_reference(owner)],
        },
        **body,
    }
    obj["metadata"]["annotations"][HASH_ANNOTATION] = content_hash(obj)
    return obj


def deployment(spec: InferenceServiceSpec, owner: Owner, config: OperatorConfig) -> dict[str, Any]:
    template_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(pod.PORT),
        "prometheus.io/path": "/metrics",
    }
    # The Deployment keeps reporting progress while a replica may still be loading its model.
    progress_deadline = spec.runtime.startup_timeout_seconds + 600
    return _finish("apps/v1", "Deployment", owner, {"spec": {
        "replicas": spec.desired_replicas,
        "selector": {"matchLabels": selector_labels(owner)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {
            "maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable}},
        "progressDeadlineSeconds": progress_deadline,
        "revisionHistoryLimit": 3,
        "template": {
            "metadata": {"labels": pod_labels(spec, owner), "annotations": template_annotations},
            "spec": pod.pod_spec(spec, served_name(spec, owner), config, owner.name),
        },
    }})


def pool_deployment(spec: InferenceServiceSpec, owner: Owner, config: OperatorConfig, role: str) -> dict[str, Any]:
    """`NAME-prefill` or `NAME-decode` of spec.disaggregation: the colocated Deployment of the pool's spec, its
    pods labelled with their pool (which it selects on) and running the pool's role (reconcile.pools)."""
    body = {"spec": deployment(pools.pool_spec(spec, role), owner, config)["spec"]}
    role_label = {pools.POOL_LABEL: role}
    body["spec"]["selector"]["matchLabels"].update(role_label)
    template = body["spec"]["template"]
    template["metadata"]["labels"].update(role_label)
    container = template["spec"]["containers"][0]
    container["args"] += pools.kv_args(spec, role, config)
    if role == "decode" and (key := pools.kv_source_key_volume(spec)) is not None:
        template["spec"]["volumes"].append(key[0])
        container["volumeMounts"].append(key[1])
    if role == "prefill":
        container["ports"].append(pools.kv_container_port(spec))
    return _finish("apps/v1", "Deployment", owner, body, name=pools.pool_name(owner.name, role))


def service(spec: InferenceServiceSpec, owner: Owner) -> dict[str, Any]:
    return _finish("v1", "Service", owner, {"spec": {
        "type": "ClusterIP",
        "selector": selector_labels(owner),
        "ports": [{"name": pod.PORT_NAME, "port": SERVICE_PORT, "targetPort": pod.PORT_NAME, "protocol": "TCP"}],
    }})


def pod_disruption_budget(spec: InferenceServiceSpec, owner: Owner) -> dict[str, Any]:
    # Policy: voluntary disruptions (node drains) take at most one replica at a time. maxUnavailable,
    # not minAvailable, so a single-replica service never blocks a drain forever.
    return _finish("policy/v1", "PodDisruptionBudget", owner, {"spec": {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector_labels(owner)},
    }})


def service_monitor(spec: InferenceServiceSpec, owner: Owner) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"port": pod.PORT_NAME, "path": "/metrics", "interval": "15s"}
    if spec.disaggregation is not None:   # each series says its pool: the autoscaler reads the pools apart
        source = "__meta_kubernetes_pod_label_" + _prometheus_name(pools.POOL_LABEL)
        endpoint["relabelings"] = [{"sourceLabels": [source], "targetLabel": pools.POOL_SERIES_LABEL,
                                    "action": "replace"}]
    return _finish("monitoring.coreos.com/v1", "ServiceMonitor", owner, {"spec": {
        "selector": {"matchLabels": selector_labels(owner)},
        "namespaceSelector": {"matchNames": [owner.namespace]},
        "endpoints": [endpoint],
    }})


def _prometheus_name(label: str) -> str:
    """A Kubernetes label as Prometheus' service discovery names it (every character outside [a-zA-Z0-9_] is _)."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in label)


def adapters_configmap(spec: InferenceServiceSpec, owner: Owner) -> dict[str, Any]:
    """The list of adapters the replicas' fetcher reads (reconcile.lora.fetch); not in the pod template."""
    return _finish("v1", "ConfigMap", owner, {"data": lora_fetch.configmap_data(spec)},
                   name=lora_fetch.configmap_name(owner.name))


def children(
        spec: InferenceServiceSpec, owner: Owner, config: OperatorConfig, *, with_service_monitor: bool,
) -> list[dict[str, Any]]:
    """Everything one InferenceService owns, in apply order (the adapters' list before the pods that read it).
    With spec.disaggregation the two pools' Deployments replace the colocated one (reconcile.pools)."""
    objs = [adapters_configmap(spec, owner)] if spec.runtime.lora is not None else []
    if spec.disaggregation is not None:
        objs += [pool_deployment(spec, owner, config, role) for role in POOLS]
    else:
        objs.append(deployment(spec, owner, config))
    objs += [service(spec, owner), pod_disruption_budget(spec, owner)]
    if with_service_monitor:
        objs.append(service_monitor(spec, owner))
    return objs
