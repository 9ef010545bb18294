"""`spec.observability`: where the replicas and the router send their traces (runtime/tracing.py, docs/tracing.md).

The pods get the OpenTelemetry SDK's standard variables (an OTLP/HTTP collector, a parent-based ratio sampler) and
their pod and namespace as resource attributes, so a trace names the pod that served each stage. A service that
sets no endpoint takes the operator's (the chart's `tracing.endpoint`); neither: tracing stays off.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kubeinfer.operator.spec.schema import SpecModel

ENDPOINT_PATTERN = r"^https?://[^\s/]+(/\S*)?$"


class TracingSpec(SpecModel):
    endpoint: str | None = Field(
        default=None, max_length=2048, pattern=ENDPOINT_PATTERN,
        description="An OTLP/HTTP collector, e.g. http://otel-collector.monitoring:4318 (its /v1/traces). Unset: "
                    "the operator's default (the chart's tracing.endpoint); neither set: no traces.")
    sampling_ratio: float = Field(
        default=1.0, ge=0, le=1,
        description="The share of requests that start a trace here (a client's or gateway's sampled traceparent "
                    "is always followed): OTEL_TRACES_SAMPLER parentbased_traceidratio.")


class Observability(SpecModel):
    tracing: TracingSpec | None = Field(
        default=None, description="Traces of each request across the router and the replicas (OpenTelemetry).")


def tracing_env(observability: Observability | None, default_endpoint: str, service: str) -> list[dict[str, Any]]:
    """The pod env that turns tracing on (none when no endpoint applies). `service`: the InferenceService's name."""
    tracing = observability.tracing if observability is not None else None
    endpoint = (tracing.endpoint if tracing is not None else None) or default_endpoint
    if not endpoint:
        return []
    ratio = tracing.sampling_ratio if tracing is not None else 1.0
    return [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": endpoint},
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": f"{ratio:g}"},
        {"name": "OTEL_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "OTEL_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "OTEL_RESOURCE_ATTRIBUTES",
         "value": f"k8s.pod.name=$(OTEL_POD_NAME),k8s.namespace.name=$(OTEL_POD_NAMESPACE),"
                  f"kubeinfer.inferenceservice={service}"},
    ]
