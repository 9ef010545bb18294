"""Alerts and the kube-state-metrics config: what a platform team is woken by (the Grafana dashboard it then
looks at is :mod:`kubeinfer.operator.install.dashboard`).

Python definitions, written into the Helm chart by :mod:`kubeinfer.operator.install.chart` (the chart's
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

from kubeinfer.operator.metric_names import ERRORS, GENERATION_TOKENS, KV_USAGE, RUNNING, SUCCESS, TTFT, WAITING
from kubeinfer.operator.spec import GROUP, KIND, VERSION

BY = "namespace, service, model_name"
BY_POD = "namespace, service, pod, model_name"
WINDOW = "5m"

# kube-state-metrics series (custom-resource state for ours; built-in for Deployments).
KSM_PREFIX = "kubeinfer"
ISVC_SPEC_REPLICAS = "kubeinfer_inferenceservice_spec_replicas"
ISVC_STATUS_REPLICAS = "kubeinfer_inferenceservice_status_replicas"
ISVC_READY_REPLICAS = "kubeinfer_inferenceservice_status_ready_replicas"
ISVC_MAX_REPLICAS = "kubeinfer_inferenceservice_spec_autoscaling_max_replicas"
ISVC_MIN_REPLICAS = "kubeinfer_inferenceservice_spec_autoscaling_min_replicas"
# The predictive policy's last pass (status.predictive.forecast): the arrival rate it saw and the rate it
# provisions for one cold start ahead.
ISVC_ARRIVAL_RATE = "kubeinfer_inferenceservice_status_predictive_arrival_rate"
ISVC_FORECAST_HIGH = "kubeinfer_inferenceservice_status_predictive_forecast_high"
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
                _gauge("inferenceservice_status_predictive_arrival_rate", "Arrival rate the predictive autoscaler "
                       "observed (requests/s)", ["status", "predictive", "forecast", "arrivalRate"]),
                _gauge("inferenceservice_status_predictive_forecast_high", "Arrival rate the predictive autoscaler "
                       "provisions for, one cold start ahead (requests/s)", ["status", "predictive", "forecast", "high"]),
            ],
        }]},
    }
