"""`spec.inferencePool`: an InferencePool (Gateway API Inference Extension, `inference.networking.k8s.io/v1`) of
the replicas, for users whose gateway and endpoint picker (llm-d's, or another EPP) already route inference.

Policy, decided here:
- The pool is named like the InferenceService and selects exactly the replicas' pods (the selector of their
  Deployment and Service), on the runtime's port; the endpoint picker is the user's, referenced by Service name.
  Our pods also carry llm-d's `llm-d.ai/inferenceServing` and `llm-d.ai/model` labels and serve the metrics
  gateways read (`vllm:*` names), so an EPP scores them like any other model server.
- Made only when the cluster serves the CRD. When it does not, everything else is reconciled, and the pass ends
  in a retried error (a Warning Event on the InferenceService saying what to install): the pool appears once
  the CRD does.
- Removed from the spec, the pool is deleted (only ours).
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

import kopf
from kubernetes.client import ApiException

from kubeinfer.operator.kube import Kube
from kubeinfer.operator.reconcile import builders, pod
from kubeinfer.operator.spec import InferenceServiceSpec

log = logging.getLogger(__name__)

API_VERSION = "inference.networking.k8s.io/v1"
PLURAL = "inferencepools"
SERVED_TTL_SECONDS = 30.0   # how long the answer "is the CRD served" is reused (one discovery call per period)
_served: weakref.WeakKeyDictionary[Kube, tuple[float, bool]] = weakref.WeakKeyDictionary()


class PoolUnavailable(kopf.TemporaryError):
    """spec.inferencePool is set but the cluster does not serve the CRD: retried, the rest is reconciled."""

    def __init__(self) -> None:
        super().__init__(f"spec.inferencePool: the cluster does not serve {PLURAL}.{API_VERSION.split('/')[0]} "
                         f"({API_VERSION}); install the Gateway API Inference Extension's CRDs, and the pool is "
                         "made then", delay=60)


def inference_pool(spec: InferenceServiceSpec, owner: builders.Owner) -> dict[str, Any]:
    ref = spec.inference_pool
    assert ref is not None
    return builders._finish(API_VERSION, "InferencePool", owner, {"spec": {
        "selector": {"matchLabels": builders.selector_labels(owner)},
        "targetPorts": [{"number": pod.PORT}],
        "endpointPickerRef": {"group": "", "kind": "Service", "name": ref.endpoint_picker,
                              "port": {"number": ref.endpoint_picker_port}, "failureMode": ref.failure_mode},
    }})


def served(kube: Kube) -> bool:
    now = time.monotonic()
    cached = _served.get(kube)
    if cached is None or now - cached[0] > SERVED_TTL_SECONDS:
        cached = _served[kube] = (now, kube.has_api(API_VERSION, PLURAL))
    return cached[1]


def path(owner: builders.Owner) -> str:
    return f"/apis/{API_VERSION}/namespaces/{owner.namespace}/{PLURAL}/{owner.name}"


def remove(kube: Kube, owner: builders.Owner) -> None:
    """Deletes the InferencePool named like the service if the cluster serves the CRD and the pool is ours."""
    if not served(kube):
        return
    live = kube.get(path(owner))
    if live is None or not any(ref.get("uid") == owner.uid
                               for ref in (live.get("metadata") or {}).get("ownerReferences") or ()):
        return
    try:
        kube.request("DELETE", path(owner))
        log.info("deleted InferencePool %s/%s (spec.inferencePool removed)", owner.namespace, owner.name)
    except ApiException as e:
        if e.status != 404:
            raise

