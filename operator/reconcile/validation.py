"""Checks of a parsed spec that the CRD schema cannot express; each returns readable messages.

What the schema and its CEL rules can refuse is declared in operator.spec instead, so that the API server
refuses it at apply time (flags the operator owns in runtime.extraArgs, for one).
"""

from __future__ import annotations

import re

from kubernetes.utils import parse_quantity

from kubeinfer.operator.reconcile import pools
from kubeinfer.operator.spec import POOLS, InferenceServiceSpec, Resources
from kubeinfer.operator.spec.model_pool import member_errors

MAX_NAME_WITH_ROUTER = 63 - len("-router")   # a Service name is a DNS label
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def semantic_errors(spec: InferenceServiceSpec, name: str = "") -> list[str]:
    """Problems a person must fix in the spec (of the InferenceService `name`); empty when it can be reconciled."""
    errors: list[str] = []
    if spec.model.scheme == "pvc":
        claim = spec.model.location.split("/", 1)[0]
        if not DNS1123_LABEL.match(claim):
            errors.append(f"model.uri pvc://{claim}/...: {claim!r} is not a valid PersistentVolumeClaim name")
    if spec.model.scheme in ("hf", "s3") and not spec.model.location.strip("/"):
        errors.append(f"model.uri {spec.model.uri!r} names no repository or bucket")
    errors += _quantity_errors(spec.resources)
    if spec.disaggregation is not None:
        for role in POOLS:
            if (own := spec.disaggregation.pool(role).resources) is not None:
                errors += [f"disaggregation.{role}.{e}" for e in _quantity_errors(own)]
    errors += _adapter_errors(spec, name)
    errors += member_errors(spec, name)
    if spec.router_enabled:
        errors += _router_errors(spec, name)
    if not errors and spec.disaggregation is None:
        errors += _kv_cache_errors(spec)
    elif not errors:
        for role in POOLS:
            errors += [f"disaggregation.{role}: {e}" for e in _kv_cache_errors(pools.pool_spec(spec, role))]
    return errors


def _adapter_errors(spec: InferenceServiceSpec, name: str) -> list[str]:
    """What spec.adapters needs from the rest of the spec (its own rules are in operator.spec.adapters)."""
    errors = []
    served = spec.model.served_name or name
    model_claim = spec.model.location.split("/", 1)[0] if spec.model.scheme == "pvc" else None
    for adapter in spec.adapters:
        where = f"adapters {adapter.name}"
        if adapter.name == served:
            errors.append(f"{where}: the name is the base model's served name ({served}); clients name the base "
                          "model by it")
        if adapter.scheme in ("hf", "s3") and not adapter.location.strip("/"):
            errors.append(f"{where}: uri {adapter.uri!r} names no repository or bucket")
        if adapter.scheme == "pvc":
            claim, _, path = adapter.location.partition("/")
            if claim != model_claim:
                errors.append(f"{where}: pvc:// adapters must be on the model's own claim "
                              f"({model_claim or 'the model is not on a claim'}), not {claim!r}: mounting another "
                              "claim would change the pod template (a rollout); use hf://, s3:// or file://")
            elif not path.strip("/"):
                errors.append(f"{where}: uri {adapter.uri!r} names no folder inside the claim")
    lora = spec.runtime.lora
    if lora is not None and len(spec.adapters) > lora.cpu_slots:
        errors.append(f"adapters: {len(spec.adapters)} adapters, more than runtime.lora.maxCpuLoras "
                      f"({lora.cpu_slots}) that a replica keeps loaded; raise it")
    return errors


def _quantity_errors(resources: Resources) -> list[str]:
    errors = []
    for name in ("cpu", "memory", "shm_size"):
        value = getattr(resources, name)
        field = "resources." + ("shmSize" if name == "shm_size" else name)
        try:
            if value is not None and parse_quantity(value) <= 0:
                errors.append(f"{field} must be above zero, got {value!r}")
        except ValueError:
            errors.append(f"{field} {value!r} is not a Kubernetes quantity (e.g. 500m, 2, 8Gi)")
    return errors


def _router_errors(spec: InferenceServiceSpec, name: str) -> list[str]:
    assert spec.router is not None
    errors = []
    for field in ("cpu", "memory"):
        value = getattr(spec.router, field)
        try:
            if parse_quantity(value) <= 0:
                errors.append(f"router.{field} must be above zero, got {value!r}")
        except ValueError:
            errors.append(f"router.{field} {value!r} is not a Kubernetes quantity (e.g. 250m, 512Mi)")
    if len(name) > MAX_NAME_WITH_ROUTER:
        errors.append(f"router: the router's Service is named {name}-router, over 63 characters; the "
                      f"InferenceService's name may have at most {MAX_NAME_WITH_ROUTER} with spec.router")
    return errors


def _kv_cache_errors(spec: InferenceServiceSpec) -> list[str]:
    kv_gib, memory = spec.runtime.kv_cache_memory_gib, spec.resources.memory
    if not spec.on_cpu or kv_gib is None or memory is None:
        return []
    total_gib = float(parse_quantity(memory)) / 2**30
    if kv_gib * spec.parallelism.processes >= total_gib:
        return [f"runtime.kvCacheMemoryGib {kv_gib:g} per process x {spec.parallelism.processes} leaves no room for "
                f"the model in resources.memory {memory} on CPU"]
    return []
