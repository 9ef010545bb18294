"""The Grafana dashboard of the install: one row of two panels per question a platform team asks (latency,
throughput, queueing, KV cache, replicas, the router). Written into the chart's ``files/`` by
:mod:`kubeinfer.operator.install.chart`; the labels it groups by are explained in
:mod:`kubeinfer.operator.install.monitoring`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.install.monitoring import (
    ISVC_ARRIVAL_RATE, ISVC_FORECAST_HIGH, ISVC_MAX_REPLICAS, ISVC_READY_REPLICAS, ISVC_SPEC_REPLICAS,
)
from kubeinfer.operator.metric_names import (
    ACCELERATORS, E2E, ERRORS, GENERATION_TOKENS, ITL, KV_USAGE, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES,
    PROMPT_TOKENS, ROUTER_ADDED, ROUTER_PICKS, ROUTER_QUEUE, ROUTER_RESUMES, ROUTER_UPSTREAM_ERRORS, RUNNING,
    SPEC_ACCEPTED, SPEC_DRAFT_TOKENS, SPEC_DRAFTS, SUCCESS, TENANT_BUSY_SECONDS, TENANT_GENERATION_TOKENS,
    TENANT_PROMPT_TOKENS, TENANT_TTFT, TTFT, WAITING,
)

SEL = 'namespace=~"$namespace", service=~"$service", model_name=~"$model"'
ISVC_SEL = 'namespace=~"$namespace", inferenceservice=~"$service"'
ROUTER_SEL = 'namespace=~"$namespace", service=~"($service)-router"'
RATE = "$__rate_interval"
GPU_HOUR_PRICE = "2.5"   # the default of the dashboard's $gpu_hour_price (USD per GPU-hour)
# Per pod: a tenant's busy seconds per second times the pod's GPUs (a CPU replica counts as one: replica-seconds).
_TENANT_GPUS = (f"sum by (tenant) (rate({TENANT_BUSY_SECONDS}{{{SEL}}}[{RATE}]) * on (namespace, service, pod, "
                f"model_name) group_left () clamp_min({ACCELERATORS}{{{SEL}}}, 1))")


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    description: str = ""
    kind: str = "timeseries"


def _dq(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, sum by (service, le) (rate({metric}_bucket{{{SEL}}}[{RATE}])))"


def _rate(metric: str, by: str = "service", extra: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{{{SEL}{extra}}}[{RATE}]))"


def _tenant_tokens(by: str) -> str:
    """Prompt and generated tokens per second (what a replica computes for them), summed by `by`."""
    return f"({_rate(TENANT_PROMPT_TOKENS, by)} + {_rate(TENANT_GENERATION_TOKENS, by)})"


def _router_rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{ROUTER_SEL}}}[{RATE}]))"


PANELS: list[Panel] = [
    Panel("Time to first token", "s", [(_dq(0.5, TTFT), "P50 {{service}}"), (_dq(0.95, TTFT), "P95 {{service}}")],
          "Arrival to first generated token; the autoscaler holds P95 at spec.autoscaling.targetTTFTP95Seconds."),
    Panel("Inter-token latency", "s", [(_dq(0.5, ITL), "P50 {{service}}"), (_dq(0.95, ITL), "P95 {{service}}")]),
    Panel("End-to-end latency", "s", [(_dq(0.5, E2E), "P50 {{service}}"), (_dq(0.95, E2E), "P95 {{service}}")]),
    Panel("Tokens per second", "short", [(_rate(GENERATION_TOKENS), "generated {{service}}"),
                                         (_rate(PROMPT_TOKENS), "prompt {{service}}")]),
    Panel("Generated tokens per second per replica", "short",
          [(f"{_rate(GENERATION_TOKENS)} / count by (service) ({RUNNING}{{{SEL}}})", "{{service}}")]),
    Panel("Queue depth", "short", [(f"sum by (service) ({WAITING}{{{SEL}}})", "waiting {{service}}"),
                                   (f"sum by (service) ({RUNNING}{{{SEL}}})", "running {{service}}")],
          "Waiting requests drive scale-up (spec.autoscaling.targetQueueDepthPerReplica)."),
    Panel("KV cache usage", "percentunit", [(f"max by (pod) ({KV_USAGE}{{{SEL}}})", "{{pod}}")]),
    Panel("Prefix cache hit rate", "percentunit",
          [(f"{_rate(PREFIX_HITS)} / {_rate(PREFIX_QUERIES)}", "{{service}}")],
          "Share of prompt tokens served from cached KV blocks."),
    Panel("Preemptions per second", "short", [(_rate(PREEMPTIONS), "{{service}}")],
          "Sequences evicted for recompute when the KV cache runs out."),
    Panel("Speculative decoding: acceptance", "short",
          [(f"{_rate(SPEC_ACCEPTED)} / {_rate(SPEC_DRAFT_TOKENS)}", "accepted share of drafts {{service}}"),
           (f"1 + {_rate(SPEC_ACCEPTED)} / {_rate(SPEC_DRAFTS)}", "tokens per verify step {{service}}")],
          "With spec.runtime.speculative: the share of draft tokens the model accepted, and the tokens a sequence "
          "gains per step where it verified drafts (1 = speculation gains nothing)."),
    Panel("Desired vs ready replicas", "short",
          [(f"sum by (inferenceservice) ({ISVC_SPEC_REPLICAS}{{{ISVC_SEL}}})", "desired {{inferenceservice}}"),
           (f"sum by (inferenceservice) ({ISVC_READY_REPLICAS}{{{ISVC_SEL}}})", "ready {{inferenceservice}}"),
           (f"sum by (inferenceservice) ({ISVC_MAX_REPLICAS}{{{ISVC_SEL}}})", "max {{inferenceservice}}")],
          "From kube-state-metrics' custom-resource state (see the chart's kube-state-metrics config)."),
    Panel("Predictive autoscaling: arrivals vs forecast", "reqps",
          [(f"sum by (inferenceservice) ({ISVC_ARRIVAL_RATE}{{{ISVC_SEL}}})", "arrivals {{inferenceservice}}"),
           (f"sum by (inferenceservice) ({ISVC_FORECAST_HIGH}{{{ISVC_SEL}}})",
            "provisioned for, one cold start ahead {{inferenceservice}}")],
          "With spec.autoscaling.policy predictive: the arrival rate the autoscaler observed and the forecast it "
          "sizes the fleet for (status.predictive.forecast)."),
    # Tenants (API keys; docs/server.md): the label's values come from the runtime's keys file.
    Panel("Tokens per second by tenant", "short", [(_tenant_tokens("tenant"), "{{tenant}}")],
          "Prompt and generated tokens of each tenant (an API key's tenant, or anonymous)."),
    Panel("Time to first token by tenant", "s",
          [(f"histogram_quantile(0.95, sum by (tenant, le) (rate({TENANT_TTFT}_bucket{{{SEL}}}[{RATE}])))",
            "P95 {{tenant}}")],
          "With runtime.schedulingPolicy fair, a small tenant's P95 stays near its own under another's flood."),
    Panel("Estimated replicas used by tenant", "short",
          [(f"{_tenant_tokens('tenant')} / scalar({_tenant_tokens('namespace')}) * "
            f"scalar(count({RUNNING}{{{SEL}}}))", "{{tenant}}")],
          "The replicas serving the selection, shared out by the tokens each tenant had computed: its cost in "
          "replica-seconds per second (times resources.gpus for GPU-seconds). Tokens stand for compute; a "
          "prompt token costs less than a generated one on a GPU, so this favours long-prompt tenants."),
    Panel("Estimated cost by tenant", "currencyUSD", [(f"{_TENANT_GPUS} * $gpu_hour_price", "{{tenant}}")],
          "USD per hour: each engine step's time shared out by the tokens each tenant computed in it "
          "(kubeinfer_tenant_busy_seconds_total), times the replica's GPUs, times $gpu_hour_price. Busy time only: "
          "idle replicas are nobody's. A CPU replica counts as one GPU: read the price as a replica-hour's."),
    Panel("Errors by status code", "reqps", [(_rate(ERRORS, "status_code"), "{{status_code}}")]),
    Panel("Finished requests by reason", "reqps", [(_rate(SUCCESS, "finished_reason"), "{{finished_reason}}")]),
    # The router of an InferenceService (spec.router): its Service is NAME-router, its series carry no model_name.
    Panel("Router: requests waiting for a replica", "short",
          [(f"sum by (service) ({ROUTER_QUEUE}{{{ROUTER_SEL}}})", "{{service}}")],
          "Held while no replica is ready (scale from zero, all restarting); the autoscaler counts them as queued."),
    Panel("Router: picks by reason", "reqps", [(_router_rate(ROUTER_PICKS, "reason"), "{{reason}}")],
          "prefix: the pick holds part of the prompt's prefix; bounded: a replica with more of it was over the "
          "load bound; load: no replica held any of it."),
    Panel("Router: upstream errors", "reqps", [(_router_rate(ROUTER_UPSTREAM_ERRORS, "kind"), "{{kind}}")],
          "connect and draining are retried on another replica; disconnect cut a request on its replica."),
    Panel("Router: requests whose replica failed", "reqps",
          [(_router_rate(ROUTER_RESUMES, "outcome"), "{{outcome}}")],
          "retried: before an answer, on another replica; resumed: a stream continued on another replica; "
          "failed: ended with an error event (not resumable, or no replica)."),
    Panel("Router: added latency", "s",
          [(f"histogram_quantile({q}, sum by (service, le) (rate({ROUTER_ADDED}_bucket{{{ROUTER_SEL}}}[{RATE}])))",
            f"P{round(q * 100)} {{{{service}}}}") for q in (0.5, 0.95)],
          "Router time before a request leaves for a replica (parse, hash, pick)."),
]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    """Grafana dashboard JSON model (schemaVersion 39), two panels per row."""
    panels = []
    for index, panel in enumerate(PANELS):
        panels.append({
            "id": index + 1,
            "type": panel.kind,
            "title": panel.title,
            "description": panel.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "range": True,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (expr, legend) in enumerate(panel.targets)],
        })
    return {
        "uid": "kubeinfer-overview",
        "title": "kubeinfer / InferenceServices",
        "tags": ["kubeinfer", "llm", "inference"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1},
            _variable("namespace", "Namespace", f"label_values({WAITING}, namespace)"),
            _variable("service", "InferenceService", f'label_values({WAITING}{{namespace=~"$namespace"}}, service)'),
            _variable("model", "Model", f'label_values({WAITING}{{service=~"$service"}}, model_name)'),
            {"name": "gpu_hour_price", "label": "GPU-hour price (USD)", "type": "textbox", "query": GPU_HOUR_PRICE,
             "current": {"selected": False, "text": GPU_HOUR_PRICE, "value": GPU_HOUR_PRICE}, "hide": 0},
        ]},
        "panels": panels,
    }
