"""`spec.autoscaling`: the bounds and targets the autoscaler's policy reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kubeinfer.operator.spec.schema import SpecModel, cel, checked_by


class Autoscaling(SpecModel):
    """Read by the autoscaler policy; names fixed by docs/contracts.md."""

    model_config = checked_by(cel(
        "(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas",
        "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
    ))

    policy: Literal["reactive", "predictive"] = Field(
        default="reactive",
        description="reactive: replicas follow the measured queue, TTFT and arrival rate. predictive: replicas are "
                    "ordered one learned cold start ahead of a forecast of the arrival rate (Holt's trend with its "
                    "spread) and released once the forecast no longer needs them; the reactive rules still hold "
                    "when metrics are missing, at the bounds and for scale to and from zero. status.predictive "
                    "shows the forecast and why (docs/autoscaling.md).")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)
    target_queue_depth_per_replica: float = Field(default=4, gt=0)
    target_ttft_p95_seconds: float = Field(default=0.5, gt=0, alias="targetTTFTP95Seconds")
    target_itl_p95_seconds: float | None = Field(
        default=None, gt=0, alias="targetITLP95Seconds",
        description="Inter-token latency P95 to hold (policy: predictive): its fleet sizing counts a fleet as serving "
                    "a rate only if 95% of the tokens after the first also come within this of the one before on "
                    "the calibrated replica model (fewer sequences and prompt admissions per replica shorten the "
                    "steps). Unset: sized on the TTFT target alone.")
    metric_window_seconds: int = Field(default=60, ge=1)
    scale_up_stabilization_seconds: int = Field(default=0, ge=0)
    scale_down_stabilization_seconds: int = Field(default=300, ge=0)
    max_scale_up_step: int = Field(default=4, ge=1)
    max_scale_down_step: int = Field(default=1, ge=1)
    scale_to_zero_idle_seconds: int = Field(default=600, ge=0)
    router_metrics_url: str | None = Field(
        default=None, pattern=r"^https?://[^\s]+$",
        description="The /metrics of a `kubeinfer router` in front of this service. Requests waiting there for "
                    "a replica (kubeinfer_router_queue_requests) count as queued: with minReplicas 0, one request "
                    "at the router starts a replica.")
    initial_delay_seconds: int = Field(default=120, ge=0)
    tolerance: float = Field(default=0.1, ge=0)
    throughput_per_replica: float | None = Field(
        default=None, gt=0,
        description="Requests per second one replica serves when saturated (e.g. measured with "
                    "benchmarks/serve.py). Optional: the autoscaler measures it on its own once the fleet "
                    "has been busy for a metric window; a measurement above this value replaces it, one below "
                    "does not (a window counted busy need not have been saturated).")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        return self


def desired_replicas(replicas: int | None, autoscaling: Autoscaling | None) -> int:
    """The replicas a spec asks for (the service's, or a pool's): `replicas` wins; with autoscaling and no replicas,
    start at minReplicas but never cold (at least one) unless the ceiling says otherwise; else one."""
    if replicas is not None:
        return replicas
    if autoscaling is not None:
        return min(max(autoscaling.min_replicas, 1), autoscaling.max_replicas)
    return 1

