"""The InferenceService API: typed spec and status, the single source of truth for the CRD.

Owns: the API's names (group, version, kind), one pydantic model per section of the spec, the rules that
refuse a bad spec (each once as CEL for the API server and once as a pydantic check), and the status fields
with their condition types. Used by all three rooms (reconcile, autoscaling, install); imports nothing else
of the operator.

Field names are camelCase on the wire (aliases); Python code uses snake_case attributes. Checks that need more
than the object itself live in :mod:`kubeinfer.operator.reconcile.validation`.

    schema.py       names, the base model, CEL helpers
    model.py        spec.model
    runtime.py      spec.runtime
    placement.py    spec.parallelism, resources, scheduling, rollout
    autoscaling.py  spec.autoscaling
    disaggregation.py  spec.disaggregation (prefill and decode pools)
    routing.py      spec.router, spec.inferencePool
    adapters.py     spec.adapters and spec.runtime.lora (LoRA)
    tenants.py      spec.apiKeySecretRef's Secret reference, spec.tenants
    service.py      the whole spec and its cross-section rules; parse_spec
    status.py       status and its condition types
"""

from kubeinfer.operator.spec.adapters import Adapter, Lora
from kubeinfer.operator.spec.autoscaling import Autoscaling
from kubeinfer.operator.spec.disaggregation import POOLS, Disaggregation, PoolSpec
from kubeinfer.operator.spec.model import MODEL_URI_RE, ModelSource
from kubeinfer.operator.spec.placement import (
    TENSOR_PARALLEL_SIZES, Parallelism, Resources, Rollout, Scheduling, Toleration,
)
from kubeinfer.operator.spec.routing import InferencePoolSpec, RouterSpec
from kubeinfer.operator.spec.runtime import MANAGED_ENV, MANAGED_FLAGS, CompileCache, EnvVar, RuntimeSpec, Speculative
from kubeinfer.operator.spec.schema import (
    API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, SpecModel, cel, checked_by,
)
from kubeinfer.operator.spec.service import InferenceServiceSpec, parse_spec
from kubeinfer.operator.spec.tenants import SecretKeyRef, TenantsSpec
from kubeinfer.operator.spec.status import (
    ADAPTERS_READY, DEGRADED, METRICS_AVAILABLE, PROGRESSING, READY, SCALING_ACTIVE, ColdStartObservation, Condition,
    InferenceServiceStatus,
)

__all__ = [
    "ADAPTERS_READY", "API_VERSION", "DEGRADED", "GROUP", "KIND", "MANAGED_ENV", "MANAGED_FLAGS", "METRICS_AVAILABLE", "MODEL_URI_RE",
    "PLURAL", "PROGRESSING", "READY", "SCALING_ACTIVE", "SHORT_NAMES", "SINGULAR", "TENSOR_PARALLEL_SIZES", "VERSION",
    "POOLS", "Adapter", "Autoscaling", "Disaggregation", "PoolSpec",
    "ColdStartObservation", "CompileCache", "Condition", "EnvVar", "InferencePoolSpec",
    "InferenceServiceSpec", "InferenceServiceStatus", "Lora", "ModelSource", "Parallelism", "Resources", "Rollout",
    "RouterSpec", "RuntimeSpec", "Scheduling", "SecretKeyRef", "SpecModel", "Speculative", "TenantsSpec", "Toleration",
    "cel",
    "checked_by", "parse_spec",
]
