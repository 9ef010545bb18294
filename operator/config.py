"""Operator settings: one frozen dataclass, read once from the environment (and CLI flags)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from typing import Literal

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kubeinfer/runtime:0.1.0"
DEFAULT_S3_DOWNLOADER_IMAGE = "amazon/aws-cli:2.22.0"
DEFAULT_PEERING = "kubeinfer"

ServiceMonitorMode = Literal["auto", "always", "never"]


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """Every knob of the operator; env var ``KUBEINFER_<NAME_IN_UPPER_SNAKE>`` for each field."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    # hf:// downloads run `hf download` (huggingface_hub CLI) in this image (empty: the pod's runtime image,
    # which has it); s3:// runs `aws s3 sync`.
    hf_downloader_image: str = ""
    s3_downloader_image: str = DEFAULT_S3_DOWNLOADER_IMAGE
    service_monitor: ServiceMonitorMode = "auto"
    resync_seconds: float = 30.0
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    # Empty: peering when the default object exists, else standalone (see kubeinfer.operator.peering);
    # a name: peering is required.
    peering: str = ""
    standalone: bool = False
    priority: int = 0
    # Namespace/CRD scanning; off where the API server refuses listing namespaces.
    scanning: bool = True
    liveness_endpoint: str | None = None
    # Autoscaler: Prometheus HTTP API base URL (e.g. http://prometheus-operated.monitoring:9090); empty:
    # scrape the ready pods' /metrics directly. One decision per autoscaled InferenceService per interval.
    prometheus_url: str = ""
    autoscale_interval_seconds: float = 5.0
    # Threads running reconcile passes (kopf's executor). A pass mostly waits for the API server (~8 reads), so
    # kopf's default, min(32, CPUs + 4), held a 2-CPU operator to 6 passes at once: 200 new services took 57 s
    # to all have their Deployment (benchmarks/operator_scale.py; docs/benchmarks/kubernetes.md, "Operator at fleet
    # scale (2026-11-26)").
    handler_threads: int = 16
    # Services with spec.adapters get a reconcile pass this often besides their events: it loads what the
    # replicas' fetchers have downloaded since, and retries refused adapters (reconcile.lora).
    adapter_sync_seconds: float = 15.0
    # The cluster's pod networks (CIDRs, comma-separated in the environment): the only KV sources decode replicas
    # of spec.disaggregation accept (--kv-source-networks). Empty: the runtime's default, the private networks.
    pod_networks: tuple[str, ...] = ()
    # An OTLP/HTTP collector (http://HOST:4318) for the traces of services that name none in
    # spec.observability.tracing (the chart's tracing.endpoint). Empty: only those that name one trace.
    tracing_endpoint: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorConfig:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(f"KUBEINFER_{field.name.upper()}")
            if raw is None:
                continue
            values[field.name] = _coerce(field.name, field.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)  # type: ignore[arg-type]
        if config.service_monitor not in ("auto", "always", "never"):
            raise ValueError(f"KUBEINFER_SERVICE_MONITOR must be auto, always or never, not {config.service_monitor!r}")
        if config.handler_threads < 1:
            raise ValueError("KUBEINFER_HANDLER_THREADS must be >= 1")
        if config.autoscale_interval_seconds <= 0:
            raise ValueError("KUBEINFER_AUTOSCALE_INTERVAL_SECONDS must be > 0")
        if config.adapter_sync_seconds <= 0:
            raise ValueError("KUBEINFER_ADAPTER_SYNC_SECONDS must be > 0")
        for network in config.pod_networks:
            try:
                ipaddress.ip_network(network)
            except ValueError as e:
                raise ValueError(f"KUBEINFER_POD_NETWORKS: {network!r} is not a network (e.g. 10.244.0.0/16): {e}") \
                    from None
        return config


def _coerce(name: str, annotation: object, raw: str) -> object:
    kind = str(annotation)
    if kind == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind.startswith("tuple"):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw
