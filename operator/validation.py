"""Checks of a parsed spec that the CRD schema cannot express; each returns readable messages."""

from __future__ import annotations

import re

from kubernetes.utils import parse_quantity

from kubeinfer.operator.pod import MANAGED_FLAGS
from kubeinfer.operator.spec import InferenceServiceSpec, Resources

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _env_name(flag: str) -> str:
    return "KUBEINFER_" + flag.lstrip("-").replace("-", "_").upper()


def semantic_errors(spec: InferenceServiceSpec) -> list[str]:
    """Problems a person must fix in the spec; empty when the spec can be reconciled."""
    errors: list[str] = []
    for arg in spec.runtime.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            errors.append(f"runtime.extraArgs must not set {flag}: the operator sets it from the spec")
    managed_env = {_env_name(flag) for flag in MANAGED_FLAGS}
    for var in spec.runtime.env:
        if var.name in managed_env:
            errors.append(f"runtime.env must not set {var.name}: the operator sets the matching flag")
    if spec.model.scheme == "pvc":
        claim = spec.model.location.split("/", 1)[0]
        if not DNS1123_LABEL.match(claim):
            errors.append(f"model.uri pvc://{claim}/...: {claim!r} is not a valid PersistentVolumeClaim name")
    if spec.model.scheme in ("hf", "s3") and not spec.model.location.strip("/"):
        errors.append(f"model.uri {spec.model.uri!r} names no repository or bucket")
    errors += _quantity_errors(spec.resources)
    if not errors:
        errors += _kv_cache_errors(spec)
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


def _kv_cache_errors(spec: InferenceServiceSpec) -> list[str]:
    kv_gib, memory = spec.runtime.kv_cache_memory_gib, spec.resources.memory
    if not spec.on_cpu or kv_gib is None or memory is None:
        return []
    total_gib = float(parse_quantity(memory)) / 2**30
    if kv_gib * spec.parallelism.tensor >= total_gib:
        return [f"runtime.kvCacheMemoryGib {kv_gib:g} per process x {spec.parallelism.tensor} leaves no room for "
                f"the model in resources.memory {memory} on CPU"]
    return []
