"""The whole spec of an InferenceService: its sections, and the rules across them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from kubeinfer.operator.spec.adapters import (
    ADAPTER_NAMES_UNIQUE, ADAPTER_NOT_SERVED_NAME, ADAPTERS_NEED_LORA, MAX_ADAPTERS, Adapter,
)
from kubeinfer.operator.spec.autoscaling import Autoscaling, desired_replicas
from kubeinfer.operator.spec.disaggregation import RULES as DISAGGREGATION_RULES
from kubeinfer.operator.spec.disaggregation import Disaggregation, disaggregation_errors
from kubeinfer.operator.spec.model import ModelSource
from kubeinfer.operator.spec.model_pool import RULES as MODEL_POOL_RULES
from kubeinfer.operator.spec.model_pool import ModelPool, model_pool_errors
from kubeinfer.operator.spec.observability import Observability
from kubeinfer.operator.spec.placement import Parallelism, Resources, Rollout, Scheduling
from kubeinfer.operator.spec.routing import InferencePoolSpec, RouterSpec
from kubeinfer.operator.spec.runtime import RuntimeSpec
from kubeinfer.operator.spec.schema import SpecModel, cel, checked_by
from kubeinfer.operator.spec.tenants import RULES as TENANT_RULES
from kubeinfer.operator.spec.tenants import SecretKeyRef, TenantsSpec, tenant_errors


_TENSOR = "(has(self.parallelism) && has(self.parallelism.tensor) ? self.parallelism.tensor : 1)"
_EXPERT = "(has(self.parallelism) && has(self.parallelism.expert) ? self.parallelism.expert : 1)"
GPUS_MATCH_SHARDS = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus == 0 || self.resources.gpus == "
    f"({_TENSOR} > {_EXPERT} ? {_TENSOR} : {_EXPERT})",
    "resources.gpus must be 0 (run on CPU) or equal the larger of parallelism.tensor and parallelism.expert "
    "(one GPU per runtime process)",
)
CPU_HAS_NO_GPU_PRODUCT = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus != 0 || "
    "!has(self.resources.gpuProduct)",
    "resources.gpuProduct needs GPUs: remove it, or set resources.gpus above 0",
)
CPU_HAS_NO_GPU_MEMORY = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus != 0 || !has(self.runtime) || "
    "!has(self.runtime.gpuMemoryUtilization)",
    "runtime.gpuMemoryUtilization applies to GPUs; with resources.gpus 0 the KV cache is sized from "
    "resources.memory or runtime.kvCacheMemoryGib",
)
DRAFT_WITHOUT_TENSOR_PARALLELISM = cel(
    "!has(self.runtime) || !has(self.runtime.speculative) || self.runtime.speculative.method != 'draft' || "
    "!has(self.parallelism) || !has(self.parallelism.tensor) || self.parallelism.tensor == 1",
    "runtime.speculative method draft runs with parallelism.tensor 1 only; use method ngram with tensor "
    "parallelism",
)
# `self.replicas < 0`: a negative count is refused once, by the scale subresource's own check.
REPLICAS_IN_BOUNDS = cel(
    "!has(self.autoscaling) || !has(self.replicas) || self.replicas < 0 || "
    "(self.replicas >= (has(self.autoscaling.minReplicas) ? self.autoscaling.minReplicas : 1) "
    "&& self.replicas <= self.autoscaling.maxReplicas)",
    "spec.replicas must lie within [autoscaling.minReplicas, autoscaling.maxReplicas]; "
    "the autoscaler owns spec.replicas when autoscaling is set",
)


class InferenceServiceSpec(SpecModel):
    model_config = checked_by(REPLICAS_IN_BOUNDS, GPUS_MATCH_SHARDS, CPU_HAS_NO_GPU_PRODUCT, CPU_HAS_NO_GPU_MEMORY,
                              DRAFT_WITHOUT_TENSOR_PARALLELISM, ADAPTERS_NEED_LORA, ADAPTER_NOT_SERVED_NAME,
                              *TENANT_RULES, *DISAGGREGATION_RULES, *MODEL_POOL_RULES)

    model: ModelSource
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    # Defaulted by the API server too, so that `kubectl get -o wide` shows TP 1 when it is not set.
    parallelism: Parallelism = Field(default_factory=Parallelism, json_schema_extra={"default": {}})
    resources: Resources = Field(default_factory=Resources)
    replicas: int | None = Field(
        default=None, ge=0,
        description="Desired replicas, a non-negative integer (1 when unset). With autoscaling it is the starting "
                    "size and the autoscaler owns it.",
    )
    autoscaling: Autoscaling | None = None
    router: RouterSpec | None = Field(
        default=None, description="A cache-aware router in front of the replicas, which also holds requests while "
                                  "none is up (scale from zero); clients call the Service NAME-router.")
    inference_pool: InferencePoolSpec | None = Field(
        default=None, description="Also make an InferencePool NAME of the replicas for a Gateway API Inference "
                                  "Extension gateway (when its CRD is served).")
    disaggregation: Disaggregation | None = Field(
        default=None, description="Prefill and decode on separate pools of replicas (NAME-prefill, NAME-decode), "
                                  "each sized and autoscaled on its own, paired per request by the router "
                                  "(needs spec.router; docs/disaggregation.md). Replaces spec.replicas and "
                                  "spec.autoscaling.")
    scheduling: Scheduling = Field(default_factory=Scheduling)
    rollout: Rollout = Field(default_factory=Rollout)
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret with the API keys; mounted as a file for --api-keys-file. With tenants, "
                                  "weights and priorities in it, use spec.tenants instead.",
    )
    tenants: TenantsSpec | None = Field(
        default=None, description="Tenants (API keys naming tenants, weights and priorities): the Secret is mounted "
                                  "in the replicas and the router, the replicas' queue is fair between them "
                                  "(docs/operator.md). Replaces apiKeySecretRef.")
    adapters: list[Adapter] = Field(
        default_factory=list, max_length=MAX_ADAPTERS,
        description="LoRA adapters served beside the model (needs runtime.lora). Adding or removing one loads or "
                    "unloads it in the running replicas, without a rollout (docs/lora.md).",
        json_schema_extra={"x-kubernetes-validations": [ADAPTER_NAMES_UNIQUE]})
    model_pool: ModelPool | None = Field(
        default=None, description="More models in every replica, at most modelPool.maxAwake awake at a time; the "
                                  "router wakes the one each request names (needs spec.router; docs/router.md).")
    observability: Observability | None = Field(
        default=None, description="Where the replicas and the router send each request's trace (OpenTelemetry, "
                                  "OTLP/HTTP; docs/tracing.md).")

    @model_validator(mode="after")
    def _replicas_in_bounds(self) -> InferenceServiceSpec:
        a, r = self.autoscaling, self.replicas
        if a is not None and r is not None and not a.min_replicas <= r <= a.max_replicas:
            raise ValueError(REPLICAS_IN_BOUNDS["message"])
        return self

    @model_validator(mode="after")
    def _accelerators(self) -> InferenceServiceSpec:
        gpus = self.resources.gpus
        if gpus is not None and gpus not in (0, self.parallelism.processes):
            raise ValueError(GPUS_MATCH_SHARDS["message"])
        if gpus == 0 and self.resources.gpu_product is not None:
            raise ValueError(CPU_HAS_NO_GPU_PRODUCT["message"])
        if gpus == 0 and self.runtime.gpu_memory_utilization is not None:
            raise ValueError(CPU_HAS_NO_GPU_MEMORY["message"])
        speculative = self.runtime.speculative
        if speculative is not None and speculative.method == "draft" and self.parallelism.tensor != 1:
            raise ValueError(DRAFT_WITHOUT_TENSOR_PARALLELISM["message"])
        return self

    @model_validator(mode="after")
    def _adapters(self) -> InferenceServiceSpec:
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(ADAPTER_NAMES_UNIQUE["message"])
        if self.adapters and self.runtime.lora is None:
            raise ValueError(ADAPTERS_NEED_LORA["message"])
        if self.model.served_name is not None and self.model.served_name in names:
            raise ValueError(ADAPTER_NOT_SERVED_NAME["message"])
        return self

    @model_validator(mode="after")
    def _tenants(self) -> InferenceServiceSpec:
        errors = tenant_errors(self.tenants, self.api_key_secret_ref, self.runtime.scheduling_policy, self.router)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @model_validator(mode="after")
    def _layouts(self) -> InferenceServiceSpec:
        errors = disaggregation_errors(self) + model_pool_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def keys_secret_ref(self) -> SecretKeyRef | None:
        """The Secret with the API keys (mounted in the replicas and the router): tenants' or apiKeySecretRef."""
        return self.tenants.secret_ref if self.tenants is not None else self.api_key_secret_ref

    @property
    def scheduling_policy(self) -> str:
        """The replicas' waiting queue: tenants.schedulingPolicy with tenants, else runtime.schedulingPolicy."""
        return self.tenants.scheduling_policy if self.tenants is not None else self.runtime.scheduling_policy

    @property
    def prefix_cache_sharing(self) -> str:
        """tenants.prefixCacheSharing; without tenants each API key is its own tenant, isolated (the default)."""
        return self.tenants.prefix_cache_sharing if self.tenants is not None else "tenant"

    @property
    def trusted_tenant_header(self) -> str | None:
        return self.tenants.trusted_tenant_header if self.tenants is not None else None

    @property
    def max_in_flight_per_tenant(self) -> int | None:
        """The router's cap on a tenant's open requests, from spec.tenants or spec.router."""
        if self.tenants is not None and self.tenants.max_in_flight_per_tenant is not None:
            return self.tenants.max_in_flight_per_tenant
        return self.router.max_in_flight_per_tenant if self.router is not None else None

    @property
    def num_gpus(self) -> int:
        """GPUs per replica: resources.gpus, else one per runtime process."""
        return self.parallelism.processes if self.resources.gpus is None else self.resources.gpus

    @property
    def on_cpu(self) -> bool:
        return self.num_gpus == 0

    @property
    def router_enabled(self) -> bool:
        return self.router is not None and self.router.enabled

    @property
    def desired_replicas(self) -> int:
        return desired_replicas(self.replicas, self.autoscaling)



def parse_spec(raw: dict[str, Any]) -> InferenceServiceSpec:
    """Parse a spec once into the typed model; raises pydantic.ValidationError."""
    return InferenceServiceSpec.model_validate(raw)
