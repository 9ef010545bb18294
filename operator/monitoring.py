"""Alerts, the Grafana dashboard and the kube-state-metrics config: what a platform team watches.

Python definitions, written into the Helm chart by :mod:`kubeinfer.operator.chart` (the chart's
PrometheusRule template and ``files/``); tests run every expression on a real Prometheus scraping real
runtimes.

Labels. Runtime series carry ``model_name``; the scrape adds ``namespace``, ``service`` (the InferenceService
name: the operator's ServiceMonitor selects its Service, the chart's PodMonitor copies the
``kubeinfer.dev/inferenceservice`` pod label) and ``pod``. Per-service expressions group ``by (namespace,
service, model_name)``; per-pod ones add ``pod``. Operator state (desired, ready and maximum replicas) comes
from kube-state-metrics' custom-resource state, configured by :func:`kube_state_metrics_config`, as
``kubeinfer_inferenceservice_*{namespace, inferenceservice}``; Deployment readiness from kube-state-metrics'
own ``kube_deployment_*{namespace, deployment}`` (the Deployment is named after the InferenceService).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.spec import GROUP, KIND, VERSION

BY = "namespace, service, model_name"
BY_POD = "namespace, service, pod, model_name"
WINDOW = "5m"

# Runtime metric names (docs/contracts.md; kubeinfer.runtime.server.metrics).
TTFT = "kubeinfer_time_to_first_token_seconds"
ITL = "kubeinfer_inter_token_latency_seconds"
E2E = "kubeinfer_e2e_request_latency_seconds"
WAITING = "kubeinfer_num_requests_waiting"
RUNNING = "kubeinfer_num_requests_running"
KV_USAGE = "kubeinfer_kv_cache_usage_ratio"
PROMPT_TOKENS = "kubeinfer_prompt_tokens_total"
GENERATION_TOKENS = "kubeinfer_generation_tokens_total"
PREFIX_HITS = "kubeinfer_prefix_cache_hits_total"
PREFIX_QUERIES = "kubeinfer_prefix_cache_queries_total"
PREEMPTIONS = "kubeinfer_num_preemptions_total"
SPEC_DRAFT_TOKENS = "kubeinfer_spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "kubeinfer_spec_decode_num_accepted_tokens_total"
SPEC_DRAFTS = "kubeinfer_spec_decode_num_drafts_total"
SUCCESS = "kubeinfer_request_success_total"
ERRORS = "kubeinfer_request_errors_total"
ROUTER_QUEUE = "kubeinfer_router_queue_requests"
ROUTER_PICKS = "kubeinfer_router_picks_total"
ROUTER_UPSTREAM_ERRORS = "kubeinfer_router_upstream_errors_total"
ROUTER_ADDED = "kubeinfer_router_added_latency_seconds"

# kube-state-metrics series (custom-resource state for ours; built-in for Deployments).
KSM_PREFIX = "kubeinfer"
ISVC_SPEC_REPLICAS = "kubeinfer_inferenceservice_spec_replicas"
ISVC_STATUS_REPLICAS = "kubeinfer_inferenceservice_status_replicas"
ISVC_READY_REPLICAS = "kubeinfer_inferenceservice_status_ready_replicas"
ISVC_MAX_REPLICAS = "kubeinfer_inferenceservice_spec_autoscaling_max_replicas"
ISVC_MIN_REPLICAS = "kubeinfer_inferenceservice_spec_autoscaling_min_replicas"
KSM_DEPLOYMENT_SPEC = "kube_deployment_spec_replicas"
KSM_DEPLOYMENT_READY = "kube_deployment_status_replicas_ready"

# Alert thresholds: values under `monitoring.alerts` in the chart, these are their defaults.
ALERT_DEFAULTS: dict[str, Any] = {
    "ttftP95Seconds": 0.3,
    "generationTokensPerSecondPerReplicaFloor": 20,
    "errorRatio": 0.001,
    "errorStatusCodes": "5..",
    "kvCacheUsageRatio": 0.9,
    "queueDepthPerReplica": 16,
}


@dataclass(frozen=True)
class Alert:
    """One alerting rule: ``signal`` (one series per group, the measured quantity) compared with a threshold.

    ``signal`` and ``guard`` are format strings over the alert values (``{errorStatusCodes}``); the test
    suite runs ``signal`` alone, which must return data from real runtimes, and the whole expression."""

    name: str
    signal: str
    op: str
    threshold: str   # key of ALERT_DEFAULTS, or a literal number
    for_: str
    severity: str
    summary: str
    description: str  # Prometheus template text ({{ $labels.x }}, {{ $value }})
    guard: str | None = None  # `and` clause: the alert only holds while this has a series

    def expr(self, values: dict[str, Any]) -> str:
        threshold = values.get(self.threshold, self.threshold)
        expr = f"{self.signal.format(**values)}\n  {self.op} {threshold}"
        if self.guard:
            expr += f"\nand on ({BY})\n  {self.guard.format(**values)}"
        return expr + "\n"

    @property
    def anchor(self) -> str:
        """Heading anchor of this alert's runbook in docs/guide.md."""
        return "alert-" + self.name.lower()


def _quantile(q: float, metric: str, by: str = BY, window: str = WINDOW) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


_REQUESTS = (f"(sum by ({BY}) (rate({SUCCESS}[{WINDOW}])) + sum by ({BY}) (rate({ERRORS}[{WINDOW}]))"
             f" or sum by ({BY}) (rate({ERRORS}[{WINDOW}])) or sum by ({BY}) (rate({SUCCESS}[{WINDOW}])))")
_WHO = "{{ $labels.namespace }}/{{ $labels.service }} ({{ $labels.model_name }})"

ALERTS: list[Alert] = [
    Alert("KubeinferTTFTP95High", _quantile(0.95, TTFT), ">", "ttftP95Seconds", "10m", "warning",
          "Time to first token P95 is over target",
          f"TTFT P95 of {_WHO} is {{{{ $value | humanizeDuration }}}} over {WINDOW}."),
    Alert("KubeinferGenerationThroughputLow",
          f"sum by ({BY}) (rate({GENERATION_TOKENS}[{WINDOW}])) / count by ({BY}) ({RUNNING})",
          "<", "generationTokensPerSecondPerReplicaFloor", "15m", "warning",
          "Generated tokens per second per replica are under the floor while requests are running",
          f"{_WHO} generates {{{{ $value | humanize }}}} tokens/s per replica with requests in flight.",
          guard=f"sum by ({BY}) (avg_over_time({RUNNING}[{WINDOW}])) > 0"),
    Alert("KubeinferErrorRateHigh",
          f"sum by ({BY}) (rate({ERRORS}{{{{status_code=~\"{{errorStatusCodes}}\"}}}}[{WINDOW}]))\n  / {_REQUESTS}",
          ">", "errorRatio", "5m", "critical",
          "Share of failed requests is over the error budget",
          f"{{{{ $value | humanizePercentage }}}} of the requests of {_WHO} fail."),
    Alert("KubeinferKVCacheNearlyFull", f"max by ({BY_POD}) (avg_over_time({KV_USAGE}[{WINDOW}]))", ">",
          "kvCacheUsageRatio", "10m", "warning",
          "KV cache usage is high; requests are being preempted or queued",
          "KV cache of pod {{ $labels.pod }} in {{ $labels.namespace }} is {{ $value | humanizePercentage }} full."),
    Alert("KubeinferQueueDepthHigh", f"sum by ({BY}) ({WAITING}) / count by ({BY}) ({WAITING})", ">",
          "queueDepthPerReplica", "5m", "warning",
          "Requests are queueing: more waiting per replica than the threshold",
          f"{_WHO} has {{{{ $value | humanize }}}} waiting requests per replica."),
    # Two series compared: the "threshold" is the right-hand side.
    Alert("KubeinferReplicasAtMax", ISVC_SPEC_REPLICAS, ">= on (namespace, inferenceservice)", ISVC_MAX_REPLICAS,
          "30m", "warning", "Autoscaler pinned at maxReplicas",
          "InferenceService {{ $labels.namespace }}/{{ $labels.inferenceservice }} has run at its maxReplicas "
          "for 30 minutes; demand may exceed what it is allowed to serve."),
    Alert("KubeinferPodsNotReady",
          f"(({KSM_DEPLOYMENT_SPEC} - {KSM_DEPLOYMENT_READY})\n  and on (namespace, deployment)"
          f" label_replace({ISVC_SPEC_REPLICAS}, \"deployment\", \"$1\", \"inferenceservice\", \"(.+)\"))",
          ">", "0", "15m", "warning", "Runtime pods are not ready",
          "{{ $value }} replica(s) of {{ $labels.namespace }}/{{ $labels.deployment }} have not been ready "
          "for 15 minutes."),
]


def rule_groups(values: dict[str, Any], runbook_base_url: str) -> list[dict[str, Any]]:
    """The PrometheusRule's `spec.groups` (also a valid `promtool check rules` file as {"groups": ...})."""
    values = {**ALERT_DEFAULTS, **values}
    rules = [{
        "alert": a.name,
        "expr": a.expr(values),
        "for": a.for_,
        "labels": {"severity": a.severity},
        "annotations": {"summary": a.summary, "description": a.description,
                        "runbook_url": f"{runbook_base_url}#{a.anchor}"},
    } for a in ALERTS]
    return [{"name": "kubeinfer.slo", "rules": rules}]


# ---------------------------------------------------------------------------------------------- dashboard

SEL = 'namespace=~"$namespace", service=~"$service", model_name=~"$model"'
ISVC_SEL = 'namespace=~"$namespace", inferenceservice=~"$service"'
ROUTER_SEL = 'namespace=~"$namespace", service=~"($service)-router"'
RATE = "$__rate_interval"


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
        ]},
        "panels": panels,
    }


# ---------------------------------------------------------------------------------- kube-state-metrics

def _gauge(name: str, help_text: str, path: list[str], nil_is_zero: bool = False) -> dict[str, Any]:
    # An absent max/min (no autoscaling) must give no series, not 0: "replicas >= 0" would always fire.
    gauge: dict[str, Any] = {"path": path}
    if nil_is_zero:
        gauge["nilIsZero"] = True
    return {"name": name, "help": help_text, "each": {"type": "Gauge", "gauge": gauge}}


def kube_state_metrics_config() -> dict[str, Any]:
    """CustomResourceStateMetrics for InferenceServices: `kubeinfer_inferenceservice_*{namespace,
    inferenceservice}`; pass to kube-state-metrics with --custom-resource-state-config-file."""
    return {
        "kind": "CustomResourceStateMetrics",
        "spec": {"resources": [{
            "groupVersionKind": {"group": GROUP, "version": VERSION, "kind": KIND},
            "metricNamePrefix": KSM_PREFIX,
            "labelsFromPath": {"namespace": ["metadata", "namespace"], "inferenceservice": ["metadata", "name"]},
            "metrics": [
                _gauge("inferenceservice_spec_replicas", "Desired replicas (the autoscaler's decision)",
                       ["spec", "replicas"]),
                _gauge("inferenceservice_status_replicas", "Replicas of the Deployment", ["status", "replicas"],
                       nil_is_zero=True),
                _gauge("inferenceservice_status_ready_replicas", "Ready replicas", ["status", "readyReplicas"],
                       nil_is_zero=True),
                _gauge("inferenceservice_spec_autoscaling_max_replicas", "Autoscaling ceiling",
                       ["spec", "autoscaling", "maxReplicas"]),
                _gauge("inferenceservice_spec_autoscaling_min_replicas", "Autoscaling floor",
                       ["spec", "autoscaling", "minReplicas"]),
            ],
        }]},
    }
