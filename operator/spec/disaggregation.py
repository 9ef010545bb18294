"""`spec.disaggregation`: prefill on some pods, decode on others (docs/disaggregation.md, "The operator").

Two pools of replicas of the same model, each sized (and autoscaled) on its own: the prefill pool computes prompts'
KV and first tokens and serves them on its KV port; the decode pool pulls them and streams the answers. The router
(`spec.router`, required) pairs each request's two replicas.

Policy, decided here (each rule once as CEL for the API server and once as a pydantic check):
- The pools' sizes live in the pools: `spec.replicas` and `spec.autoscaling` are refused beside
  `spec.disaggregation` (which of the three would `kubectl scale` or the autoscaler mean?). Without autoscaling a
  pool's `replicas` is its size (1 when unset); with it, the starting size that the autoscaler then owns.
- The prefill pool serves only the decode pool: decode `replicas` 0 with prefill `replicas` above 0 is refused.
- Both pools are autoscaled or neither, and both or neither may go to zero (`minReplicas` 0): they scale to zero
  and wake together.
- One process per replica (`parallelism.tensor` and `parallelism.expert` 1): the KV transfer sends one process's
  cache. The pools share `spec.parallelism`, so they never differ in it; they may differ in `resources`.
- No LoRA (`runtime.lora`): a pulled request cannot carry an adapter yet.
- Signed KV-source hints are on when `kvSourceKeySecretRef` names a Secret: the router and the decode pods mount its
  key (the kubelet does; the operator never reads it) and a decode replica then pulls only from a source the router
  signed. Off by default, since the key is the user's to create (the operator may not write Secrets).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from kubeinfer.operator.spec.autoscaling import Autoscaling, desired_replicas
from kubeinfer.operator.spec.placement import Resources
from kubeinfer.operator.spec.schema import SpecModel, cel, checked_by

POOLS = ("prefill", "decode")
DEFAULT_KV_PORT = 9100
RUNTIME_PORT = 8000   # the replicas' HTTP port (reconcile.pod.PORT); the KV port must be another


def _replicas(pool: str) -> str:
    return f"(has(self.{pool}.replicas) ? self.{pool}.replicas : 1)"


def _min(pool: str) -> str:
    a = f"self.{pool}.autoscaling"
    return f"(has({a}.minReplicas) ? {a}.minReplicas : 1)"


DECODE_FOR_PREFILL = cel(
    f"{_replicas('prefill')} == 0 || {_replicas('decode')} > 0",
    "disaggregation.decode.replicas must be above 0 while disaggregation.prefill.replicas is: the prefill pool "
    "serves only the decode pool",
)
AUTOSCALED_TOGETHER = cel(
    "has(self.prefill.autoscaling) == has(self.decode.autoscaling)",
    "disaggregation.prefill.autoscaling and disaggregation.decode.autoscaling go together: autoscale both pools "
    "or neither (they scale to zero and wake together)",
)
ZERO_TOGETHER = cel(
    f"!has(self.prefill.autoscaling) || !has(self.decode.autoscaling) || ({_min('prefill')} == 0) == "
    f"({_min('decode')} == 0)",
    "disaggregation.prefill.autoscaling.minReplicas and disaggregation.decode.autoscaling.minReplicas are 0 "
    "together or not at all: the pools scale to zero and wake together",
)


def _in_bounds(pool: str) -> dict[str, Any]:
    a = f"self.{pool}.autoscaling"
    return cel(
        f"!has({a}) || !has(self.{pool}.replicas) || (self.{pool}.replicas >= {_min(pool)} && "
        f"self.{pool}.replicas <= {a}.maxReplicas)",
        f"disaggregation.{pool}.replicas must lie within [disaggregation.{pool}.autoscaling.minReplicas, "
        f"disaggregation.{pool}.autoscaling.maxReplicas]; the autoscaler owns it when autoscaling is set",
    )


PREFILL_IN_BOUNDS, DECODE_IN_BOUNDS = _in_bounds("prefill"), _in_bounds("decode")

# Rules across the whole spec (operator.spec.service lists them).
_ON = "!has(self.disaggregation) || "
NEEDS_ROUTER = cel(
    _ON + "(has(self.router) && (!has(self.router.enabled) || self.router.enabled))",
    "spec.disaggregation needs spec.router: the router pairs each request's prefill and decode replicas",
)
OWNS_REPLICAS = cel(
    _ON + "(!has(self.replicas) && !has(self.autoscaling))",
    "spec.replicas and spec.autoscaling do not apply with spec.disaggregation: set replicas and autoscaling per "
    "pool, in disaggregation.prefill and disaggregation.decode",
)
ONE_PROCESS = cel(
    _ON + "!has(self.parallelism) || ((!has(self.parallelism.tensor) || self.parallelism.tensor == 1) && "
    "(!has(self.parallelism.expert) || self.parallelism.expert == 1))",
    "spec.disaggregation runs with parallelism.tensor 1 and parallelism.expert 1: the KV transfer sends one "
    "process's cache",
)
NO_LORA = cel(
    _ON + "!has(self.runtime) || !has(self.runtime.lora)",
    "spec.disaggregation does not serve LoRA yet: remove runtime.lora (a pulled request cannot carry an adapter)",
)
RULES = (NEEDS_ROUTER, OWNS_REPLICAS, ONE_PROCESS, NO_LORA)


ONE_GPU = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus <= 1",
    "disaggregation.prefill.resources.gpus and disaggregation.decode.resources.gpus must be 0 (run on CPU) or 1: "
    "a replica of either pool is one process",
)


class PoolSpec(SpecModel):
    """One pool of `spec.disaggregation`: its size, its pods' resources and its autoscaling."""

    model_config = checked_by(ONE_GPU)

    replicas: int | None = Field(
        default=None, ge=0,
        description="Replicas of this pool (1 when unset). With autoscaling it is the starting size and the "
                    "autoscaler owns it.")
    resources: Resources | None = Field(
        default=None, description="This pool's resources per replica; spec.resources when unset.")
    autoscaling: Autoscaling | None = Field(
        default=None, description="This pool's autoscaling (the prefill pool scales on its queue and TTFT, the "
                                  "decode pool on its queue, running requests, KV cache use and inter-token "
                                  "latency); set on both pools or neither.")

    @model_validator(mode="after")
    def _one_gpu(self) -> PoolSpec:
        if self.resources is not None and (self.resources.gpus or 0) > 1:
            raise ValueError(ONE_GPU["message"])
        return self

    @property
    def desired_replicas(self) -> int:
        return desired_replicas(self.replicas, self.autoscaling)


class DecodeAutoscaling(Autoscaling):
    """The decode pool's autoscaling: spec.autoscaling's fields, and the decode pool's own targets."""

    target_kv_cache_usage: float = Field(
        default=0.8, gt=0, le=1,
        description="Share of the decode replicas' KV cache in use (mean over them) to hold: above it the pool "
                    "grows before requests are preempted for room.")
    target_itl_p95_seconds: float | None = Field(
        default=None, gt=0, alias="targetITLP95Seconds",
        description="Inter-token latency P95 of the decode pool to hold: above it the pool grows (its right value "
                    "depends on the model and hardware; unset: no ITL rule).")


class DecodePoolSpec(PoolSpec):
    autoscaling: DecodeAutoscaling | None = Field(
        default=None, description="The decode pool's autoscaling: on its queue, running requests, KV cache use and "
                                  "(with targetITLP95Seconds) inter-token latency; set on both pools or neither.")


class KvSourceKeyRef(SpecModel):
    name: str = Field(max_length=253, description="Secret in the InferenceService's namespace.")
    key: str = Field(default="kv-source-key", max_length=253,
                     description="Key of the Secret holding the shared key (at least 16 bytes, e.g. "
                                 "`openssl rand -hex 32`).")


class Disaggregation(SpecModel):
    """Prefill and decode on separate pools of replicas, paired per request by the router."""

    model_config = checked_by(DECODE_FOR_PREFILL, AUTOSCALED_TOGETHER, ZERO_TOGETHER, PREFILL_IN_BOUNDS,
                              DECODE_IN_BOUNDS)

    kv_port: int = Field(
        default=DEFAULT_KV_PORT, ge=1024, le=65535,
        description="The prefill replicas' KV endpoint (TCP), which decode replicas pull prompts' KV from.",
        json_schema_extra={"x-kubernetes-validations": [cel(
            f"self != {RUNTIME_PORT}", f"disaggregation.kvPort must not be {RUNTIME_PORT}, the replicas' HTTP port")]})
    prefill: PoolSpec = Field(description="The replicas that compute prompts' KV and first tokens.")
    decode: DecodePoolSpec = Field(description="The replicas that pull the KV and stream the answers.")
    kv_source_key_secret_ref: KvSourceKeyRef | None = Field(
        default=None,
        description="A Secret key shared by the router and the decode replicas: the router signs each KV-source "
                    "hint with it and a decode replica pulls KV only from a source so signed (a client reaching a "
                    "decode pod directly cannot name one). Unset: decode replicas take a source inside the pod "
                    "networks from anyone who reaches them.")

    @model_validator(mode="after")
    def _pools(self) -> Disaggregation:
        if self.kv_port == RUNTIME_PORT:
            raise ValueError(f"disaggregation.kvPort must not be {RUNTIME_PORT}, the replicas' HTTP port")
        prefill, decode = self.prefill, self.decode
        if prefill.desired_replicas > 0 and decode.replicas == 0:
            raise ValueError(DECODE_FOR_PREFILL["message"])
        if (prefill.autoscaling is None) != (decode.autoscaling is None):
            raise ValueError(AUTOSCALED_TOGETHER["message"])
        if prefill.autoscaling is not None and decode.autoscaling is not None and \
                (prefill.autoscaling.min_replicas == 0) != (decode.autoscaling.min_replicas == 0):
            raise ValueError(ZERO_TOGETHER["message"])
        for pool, rule in ((prefill, PREFILL_IN_BOUNDS), (decode, DECODE_IN_BOUNDS)):
            a = pool.autoscaling
            if a is not None and pool.replicas is not None and not a.min_replicas <= pool.replicas <= a.max_replicas:
                raise ValueError(rule["message"])
        return self

    def pool(self, role: str) -> PoolSpec:
        assert role in POOLS, role
        return self.prefill if role == "prefill" else self.decode

    @property
    def autoscaled(self) -> bool:
        return self.prefill.autoscaling is not None


def disaggregation_errors(spec: Any) -> list[str]:
    """The messages of the rules across the spec (RULES) that `spec` (an InferenceServiceSpec) breaks."""
    if spec.disaggregation is None:
        return []
    errors = []
    if not spec.router_enabled:
        errors.append(NEEDS_ROUTER["message"])
    if spec.replicas is not None or spec.autoscaling is not None:
        errors.append(OWNS_REPLICAS["message"])
    if spec.parallelism.tensor != 1 or spec.parallelism.expert != 1:
        errors.append(ONE_PROCESS["message"])
    if spec.runtime.lora is not None:
        errors.append(NO_LORA["message"])
    return errors
