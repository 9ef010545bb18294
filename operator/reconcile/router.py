"""The router of an InferenceService (`spec.router`): pure builders of its Deployment and Service, and the one
write that tells its pods which replicas are ready.

Policy, decided here (docs/router.md argues it):
- One router per InferenceService: a Deployment `NAME-router` running `kubeinfer router` from the runtime image,
  and a Service `NAME-router` (port 80) that clients call; `status.endpoint` names it while the router is on.
  The Service `NAME` keeps going straight to the replicas (a bypass, and what the ServiceMonitor scrapes).
- Discovery without the API server: each router pod reads its replicas from a file, a downward API volume of
  its own annotation `kubeinfer.dev/router-endpoints`, which the operator keeps equal to the ready replicas
  (`sync_endpoints`, on every reconcile pass, i.e. on every pod event). So the router pod has no token and no
  RBAC (only who may patch pods can redirect it), and it works where pods cannot reach the API server.
- Router pods carry their own label (`kubeinfer.dev/router`), never the replicas' selector label: the replicas'
  Service, PDB and Deployment must not select them.
- The router is CPU-only: it does not inherit the replicas' node selector, tolerations or GPUs.
- Turned off (`spec.router.enabled: false`, or `spec.router` removed): its Deployment and Service are deleted.
- With `spec.disaggregation` the replicas above are the decode pool's, and the prefill pool's ready replicas go
  into a second annotation, `kubeinfer.dev/router-prefill-endpoints`, read the same way (`--prefill-endpoints-file`);
  both are written in one patch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.kube import Kube, resource_path
from kubeinfer.operator.reconcile import builders, model_pool, pod, pools, security
from kubeinfer.operator.reconcile.apply import delete_owned
from kubeinfer.operator.spec import GROUP, InferenceServiceSpec
from kubeinfer.operator.spec.observability import tracing_env

log = logging.getLogger(__name__)

ROUTER_LABEL = f"{GROUP}/router"
ENDPOINTS_ANNOTATION = f"{GROUP}/router-endpoints"
PORT = 8080
ENDPOINTS_DIR = "/etc/kubeinfer/router"
ENDPOINTS_FILE = f"{ENDPOINTS_DIR}/endpoints"
PREFILL_ENDPOINTS_ANNOTATION = f"{GROUP}/router-prefill-endpoints"
PREFILL_ENDPOINTS_FILE = f"{ENDPOINTS_DIR}/prefill-endpoints"


def name(owner: builders.Owner) -> str:
    return f"{owner.name}-router"


def endpoint(owner: builders.Owner) -> str:
    """The in-cluster OpenAI base URL of the router."""
    return f"http://{name(owner)}.{owner.namespace}.svc/v1"


def selector_labels(owner: builders.Owner) -> dict[str, str]:
    return {ROUTER_LABEL: owner.name}


def selector_string(owner: builders.Owner) -> str:
    return f"{ROUTER_LABEL}={owner.name}"


def pod_labels(owner: builders.Owner) -> dict[str, str]:
    return {**selector_labels(owner), "app.kubernetes.io/name": "kubeinfer-router",
            "app.kubernetes.io/instance": owner.name, "app.kubernetes.io/component": "router",
            builders.MANAGED_BY_LABEL: builders.MANAGED_BY}


def router_args(spec: InferenceServiceSpec, owner: builders.Owner) -> list[str]:
    r = spec.router
    assert r is not None
    return [
        "--endpoints-file", ENDPOINTS_FILE,
        "--host", "0.0.0.0",
        "--port", str(PORT),
        # a pool serves its models' names (reconcile.model_pool)
        *(["--served-model-name", builders.served_name(spec, owner)] if spec.model_pool is None
          else model_pool.router_args(spec, builders.served_name(spec, owner), pod.PORT)),
        "--policy", r.policy,
        "--prefix-weight", str(r.prefix_weight),
        "--load-weight", str(r.load_weight),
        "--kv-weight", str(r.kv_weight),
        "--footprint-weight", str(r.footprint_weight),
        "--load-bound-epsilon", str(r.load_bound_epsilon),
        "--max-queued-requests", str(r.max_queued_requests),
        "--queue-timeout", str(r.queue_timeout_seconds),
        # Streams through the router last as long as the replicas' own: drain as long as they do.
        "--drain-timeout-seconds", str(spec.runtime.drain_timeout_seconds),
        # The replicas' keys file tells the router each request's tenant (it checks no key itself).
        *(["--api-keys-file", pod.API_KEYS_FILE] if spec.keys_secret_ref is not None else []),
        *(["--max-in-flight-per-tenant", str(spec.max_in_flight_per_tenant)]
          if spec.max_in_flight_per_tenant is not None else []),
        # Prefix affinity keys prefixes as the replicas' caches do.
        *(["--prefix-cache-sharing", spec.prefix_cache_sharing] if spec.prefix_cache_sharing != "tenant" else []),
        *(["--trusted-tenant-header", spec.trusted_tenant_header] if spec.trusted_tenant_header else []),
        # The replicas above are then the decode pool.
        *(["--prefill-endpoints-file", PREFILL_ENDPOINTS_FILE] if spec.disaggregation is not None else []),
        *(["--kv-source-key-file", pod.KV_SOURCE_KEY_FILE] if pools.kv_source_key_ref(spec) is not None else []),
    ]


def pod_spec(spec: InferenceServiceSpec, owner: builders.Owner, config: OperatorConfig) -> dict[str, Any]:
    r = spec.router
    assert r is not None
    http = lambda path: {"httpGet": {"path": path, "port": pod.PORT_NAME}}  # noqa: E731
    container = {
        "name": "router",
        "image": r.image or spec.runtime.image or config.runtime_image,
        "command": ["kubeinfer", "router"],
        "args": router_args(spec, owner),
        "ports": [{"name": pod.PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": str(r.cpu), "memory": str(r.memory)}, "limits": {"memory": str(r.memory)}},
        # Ready once it has read the list of replicas (an empty list too: it then holds requests).
        "readinessProbe": {**http("/ready"), "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {**http("/health"), "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(pod.PRESTOP_SLEEP_SECONDS)]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security.container_security_context(),
        "volumeMounts": [{"name": "endpoints", "mountPath": ENDPOINTS_DIR, "readOnly": True}],
    }
    if spec.runtime.image_pull_policy:
        container["imagePullPolicy"] = spec.runtime.image_pull_policy
    if env := tracing_env(spec.observability, config.tracing_endpoint, owner.name):
        container["env"] = env
    files = [("endpoints", ENDPOINTS_ANNOTATION)]
    if spec.disaggregation is not None:
        files.append(("prefill-endpoints", PREFILL_ENDPOINTS_ANNOTATION))
    volumes = [{"name": "endpoints", "downwardAPI": {"items": [
        {"path": path, "fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}
        for path, annotation in files]}}]
    secrets = []
    if (ref := spec.keys_secret_ref) is not None:   # the same Secret as the replicas'
        secrets.append(pod.secret_file("api-keys", ref.name, ref.key, pod.API_KEYS_FILE))
    if (key := pools.kv_source_key_volume(spec)) is not None:   # the decode pods' key: it signs their KV sources
        secrets.append(key)
    for volume, mount in secrets:
        volumes.append(volume)
        container["volumeMounts"].append(mount)
    return {
        "containers": [container],
        "volumes": volumes,
        "securityContext": security.pod_security_context(),
        # Router pods on different nodes where the scheduler can: one node's loss then leaves the others.
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": selector_labels(owner)},
                                               "topologyKey": "kubernetes.io/hostname"}}]}},
        "terminationGracePeriodSeconds": pod.termination_grace_seconds(spec),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,   # it never talks to the API server
    }


def deployment(spec: InferenceServiceSpec, owner: builders.Owner, config: OperatorConfig) -> dict[str, Any]:
    assert spec.router is not None
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"}
    return builders._finish("apps/v1", "Deployment", owner, {"spec": {
        "replicas": spec.router.replicas,
        "selector": {"matchLabels": selector_labels(owner)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "revisionHistoryLimit": 3,
        "template": {"metadata": {"labels": pod_labels(owner), "annotations": annotations},
                     "spec": pod_spec(spec, owner, config)},
    }}, name=name(owner))


def service(spec: InferenceServiceSpec, owner: builders.Owner) -> dict[str, Any]:
    return builders._finish("v1", "Service", owner, {"spec": {
        "type": "ClusterIP",
        "selector": selector_labels(owner),
        "ports": [{"name": pod.PORT_NAME, "port": builders.SERVICE_PORT, "targetPort": pod.PORT_NAME,
                   "protocol": "TCP"}],
    }}, name=name(owner))


def children(spec: InferenceServiceSpec, owner: builders.Owner, config: OperatorConfig) -> list[dict[str, Any]]:
    return [deployment(spec, owner, config), service(spec, owner)] if spec.router_enabled else []


def _is_ready(p: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((p.get("status") or {}).get("conditions") or []))


def serving_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that serve: Ready, not being deleted, with an IP (as an EndpointSlice's `ready`)."""
    return [p for p in pods if _is_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("podIP")]


def ready_endpoints(replica_pods: list[dict[str, Any]]) -> list[str]:
    """`http://IP:PORT` of the replicas a router may use (`serving_pods`)."""
    return sorted(f"http://{p['status']['podIP']}:{pod.PORT}" for p in serving_pods(replica_pods))


def endpoints_value(urls: list[str]) -> str:
    return json.dumps(sorted(urls), separators=(",", ":"))


def router_pods(kube: Kube, owner: builders.Owner) -> list[dict[str, Any]]:
    pods = kube.list(resource_path("v1", "Pod", owner.namespace), selector_string(owner))
    # Also filter here: a server (or emulator) that ignores the selector must not mix services up.
    return [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(ROUTER_LABEL) == owner.name]


def sync_endpoints(kube: Kube, owner: builders.Owner, replica_pods: list[dict[str, Any]],
                   prefill_pods: list[dict[str, Any]] | None = None) -> int:
    """Writes the ready replicas into the annotation of every router pod where it differs; returns the writes.
    `prefill_pods` (spec.disaggregation): the prefill pool's, into the second annotation (`replica_pods` are then
    the decode pool's).

    A merge patch of the annotations: the ReplicaSet controller owns the rest of the pod. A router pod is written
    as soon as it exists (Pending too), so it usually starts with its list already in the file."""
    wanted = {ENDPOINTS_ANNOTATION: endpoints_value(ready_endpoints(replica_pods))}
    if prefill_pods is not None:
        wanted[PREFILL_ENDPOINTS_ANNOTATION] = endpoints_value(ready_endpoints(prefill_pods))
    writes = 0
    for p in router_pods(kube, owner):
        meta = p.get("metadata") or {}
        have = meta.get("annotations") or {}
        if meta.get("deletionTimestamp") or all(have.get(k) == v for k, v in wanted.items()):
            continue
        value = wanted[ENDPOINTS_ANNOTATION] + (f", prefill {wanted[PREFILL_ENDPOINTS_ANNOTATION]}"
                                                if prefill_pods is not None else "")
        if not kube.annotate_pod(owner.namespace, meta["name"], wanted):
            continue   # gone meanwhile: nothing to tell it
        writes += 1
        log.info("router pod %s/%s: replicas %s", owner.namespace, meta["name"], value)
    return writes


def remove(kube: Kube, owner: builders.Owner) -> None:
    """Deletes the router's Deployment and Service if they are there and this InferenceService's."""
    for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment")):
        delete_owned(kube, owner, api_version, kind, name(owner), "router turned off")
