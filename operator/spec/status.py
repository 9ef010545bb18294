"""`status`: every field a writer (reconcile, the autoscaler) puts there, and the condition types they write.

Conditions have constant types: reconcile writes Ready, Progressing, Degraded and, with LoRA on, AdaptersReady; the
autoscaler writes
ScalingActive and MetricsAvailable. Each writer keeps the others' conditions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from kubeinfer.operator.spec.schema import PRESERVE, SpecModel

# Condition types: reconcile's (kubeinfer.operator.reconcile.status) and the autoscaler's.
READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
ADAPTERS_READY = "AdaptersReady"
SCALING_ACTIVE, METRICS_AVAILABLE = "ScalingActive", "MetricsAvailable"


class Condition(SpecModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ColdStartObservation(SpecModel):
    """One pod's creation -> Ready, as the autoscaler observed it (operator.autoscaling.cold_start)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    pod: str
    created_at: str
    ready_at: str
    seconds: float


class AdapterPodStatus(SpecModel):
    """One adapter in one ready replica, as that replica's runtime answered."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    pod: str
    ready: bool
    message: str = ""


class AdapterStatus(SpecModel):
    """One adapter of spec.adapters across the ready replicas (reconcile.lora)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    name: str
    ready_replicas: int = Field(description="Ready replicas where it is loaded.")
    pods: list[AdapterPodStatus] = Field(default_factory=list)


class PoolStatus(SpecModel):
    """One pool of spec.disaggregation: its counts (reconcile) and, when autoscaled, the autoscaler's state for it
    (the same fields as at the top of status, for this pool)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    replicas: int | None = Field(default=None, description="Pods of the pool's Deployment.")
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    desired_replicas: int | None = Field(default=None, description="The pool's replicas in the spec (the "
                                                                   "autoscaler's last decision when autoscaled).")
    model_pool: ModelPoolStatus | None = Field(
        default=None,
        description="With spec.modelPool: each ready replica's awake and asleep models, and its wake-ups.")
    queue_depth: float | None = Field(default=None, description="Written by the autoscaler.")
    ttft_p95_seconds: float | None = Field(default=None, alias="ttftP95Seconds",
                                           description="Written by the autoscaler.")
    last_scale_time: str | None = None
    cold_start_seconds: float | None = None
    cold_start_samples: list[ColdStartObservation] | None = None
    last_signals: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE)
    predictive: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE)
    scaling_history: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE)


class DisaggregationStatus(SpecModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    prefill: PoolStatus | None = None
    decode: PoolStatus | None = None


class PoolReplicaStatus(SpecModel):
    """One ready replica of spec.modelPool (reconcile.model_pool)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    pod: str
    awake: list[str] = Field(default_factory=list)
    asleep: list[str] = Field(default_factory=list)
    wakeups: int = Field(default=0, description="Wake-ups its engines have had since they started.")
    unreachable: list[str] | None = Field(default=None, description="Models whose engine did not answer.")


class ModelPoolStatus(SpecModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    max_awake: int | None = None
    replicas: list[PoolReplicaStatus] | None = None


class InferenceServiceStatus(SpecModel):
    """Every field a writer puts under status; a real API server prunes undeclared ones."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    observed_generation: int | None = None
    replicas: int | None = Field(default=None, description="Pods of the Deployment (scale subresource).")
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    selector: str | None = Field(default=None, description="Label selector of the pods (scale subresource).")
    endpoint: str | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    adapters: list[AdapterStatus] | None = Field(
        default=None, description="Each adapter of spec.adapters and where it is loaded (with runtime.lora).")
    disaggregation: DisaggregationStatus | None = Field(
        default=None, description="Each pool of spec.disaggregation: replicas, readyReplicas, desiredReplicas and "
                                  "the autoscaler's state for it. The top-level counts are the sums of both pools.")
    model_pool: ModelPoolStatus | None = Field(
        default=None,
        description="With spec.modelPool: each ready replica's awake and asleep models, and its wake-ups.")
    queue_depth: float | None = Field(default=None, description="Written by the autoscaler.")
    ttft_p95_seconds: float | None = Field(default=None, alias="ttftP95Seconds", description="Written by the autoscaler.")
    tokens_per_second: float | None = Field(default=None, description="Written by the autoscaler.")
    desired_replicas: int | None = Field(default=None, description="Last autoscaler recommendation.")
    last_scale_time: str | None = Field(default=None, description="When the autoscaler last changed replicas.")
    cold_start_seconds: float | None = Field(
        default=None,
        description="Written by the autoscaler: pod creation -> Ready, median of coldStartSamples; replaces "
        "spec.autoscaling.initialDelaySeconds in the autoscaler's queue projection once measured.")
    cold_start_samples: list[ColdStartObservation] | None = Field(
        default=None, description="Written by the autoscaler: the last pods' creation -> Ready observations.")
    last_signals: dict[str, Any] | None = Field(
        default=None, json_schema_extra=PRESERVE,
        description="Written by the autoscaler: the signals of its last decision (queue, running, TTFT P95, rate).")
    predictive: dict[str, Any] | None = Field(
        default=None, json_schema_extra=PRESERVE,
        description="Written by the autoscaler under autoscaling.policy predictive: the forecaster's state (a "
        "restarted operator resumes it) and, under forecast, the last pass's arrival rate, forecast, fleet "
        "needed and reason.")
    scaling_history: dict[str, Any] | None = Field(
        default=None, json_schema_extra=PRESERVE,
        description="Written by the autoscaler: its windows, last scale events and learned capacity; "
        "a restarted operator resumes from it.")

