"""What sits in front of the replicas: `spec.router` (our cache-aware router) and `spec.inferencePool` (a Gateway
API Inference Extension pool for the user's own gateway)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kubeinfer.operator.spec.schema import INT_OR_STRING, SpecModel


class RouterSpec(SpecModel):
    """A `kubeinfer router` Deployment in front of the replicas (docs/router.md); its flags, under their names."""

    enabled: bool = Field(default=True, description="Deploy the router (true when spec.router is given).")
    replicas: int = Field(default=1, ge=1, le=64, description="Router pods (each keeps its own prefix index).")
    policy: Literal["prefix", "least-load", "round-robin"] = "prefix"
    prefix_weight: float = Field(default=1.0, ge=0,
                                 description="Score per share of the prompt's prefix a replica holds.")
    load_weight: float = Field(default=0.5, ge=0, description="Score taken per share of the busiest replica's load.")
    kv_weight: float = Field(default=0.25, ge=0, description="Score taken per share of a replica's KV cache in use.")
    footprint_weight: float = Field(default=0.25, ge=0,
                                    description="Score taken per share of the most prefix text sent to one replica.")
    load_bound_epsilon: float = Field(default=1.0, ge=0,
                                      description="Skip replicas above (1 + this) x the mean requests in flight.")
    max_queued_requests: int = Field(default=1024, ge=1,
                                     description="Requests that may wait for a ready replica before 429.")
    queue_timeout_seconds: float = Field(default=60, gt=0, le=3600,
                                         description="How long a request may wait for a ready replica before 503.")
    max_in_flight_per_tenant: int | None = Field(
        default=None, ge=1, description="Requests one tenant (an API key of apiKeySecretRef's Secret, or anonymous) "
                                        "may hold open at the router; more get 429. No cap when unset. With "
                                        "spec.tenants, set tenants.maxInFlightPerTenant instead.")
    image: str | None = Field(default=None, description="Router image; the runtime's image when unset.")
    cpu: int | str = Field(default="250m", json_schema_extra=INT_OR_STRING, description="CPU request of a router pod.")
    memory: int | str = Field(default="512Mi", json_schema_extra=INT_OR_STRING,
                              description="Memory request and limit of a router pod.")


class InferencePoolSpec(SpecModel):
    """An InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1) selecting the replicas,
    for a gateway and endpoint picker (EPP) the user already runs, e.g. llm-d's."""

    endpoint_picker: str = Field(
        min_length=1, max_length=253,
        description="Name of the endpoint picker's Service, in the same namespace (endpointPickerRef.name).")
    endpoint_picker_port: int = Field(default=9002, ge=1, le=65535, description="Its port (endpointPickerRef.port).")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose", description="What the gateway does when the picker does not answer.")

