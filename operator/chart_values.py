"""The install's settings: default values, their comments and the values schema, in one place.

The Helm chart's ``values.yaml`` and ``values.schema.json`` are generated from here
(:mod:`kubeinfer.operator.chart`), and ``kubeinfer manifests`` renders with the same defaults and checks
user values against the same schema, so a bad value fails the same way with or without Helm.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import yaml

from kubeinfer import __version__
from kubeinfer.operator.config import DEFAULT_RUNTIME_IMAGE
from kubeinfer.operator.monitoring import ALERT_DEFAULTS

RUNBOOK_BASE_URL = "https://github.com/kubeinfer/kubeinfer/blob/main/docs/guide.md"

DEFAULTS: dict[str, Any] = {
    "image": {"repository": "ghcr.io/kubeinfer/kubeinfer", "tag": __version__, "pullPolicy": "IfNotPresent"},
    "imagePullSecrets": [],
    "logLevel": "info",
    "watchNamespaces": [],
    "prometheusUrl": "",
    "runtimeImage": DEFAULT_RUNTIME_IMAGE,
    "serviceMonitorMode": "auto",
    "peering": {"enabled": True, "name": "kubeinfer"},
    "replicaCount": 1,
    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
    "nodeSelector": {},
    "tolerations": [],
    "affinity": {},
    "priorityClassName": "",
    "serviceAccount": {"create": True, "name": "kubeinfer-operator", "annotations": {}},
    "rbac": {"create": True},
    "monitoring": {
        "runbookBaseUrl": RUNBOOK_BASE_URL,
        "podMonitor": {"enabled": False, "interval": "15s", "labels": {}},
        "prometheusRule": {"enabled": False, "labels": {}},
        "alerts": dict(ALERT_DEFAULTS),
        "dashboard": {"enabled": False, "labels": {"grafana_dashboard": "1"}},
        "kubeStateMetrics": {"enabled": False,
                             "serviceAccount": {"name": "kube-state-metrics", "namespace": "monitoring"}},
    },
}

COMMENTS: dict[str, str] = {
    "image": "Operator image (the kubeinfer package; the container runs `kubeinfer operator`).",
    "logLevel": "info, or debug (the operator's --verbose).",
    "watchNamespaces": "Namespaces the operator watches (globs allowed); empty: all namespaces.",
    "prometheusUrl": "Prometheus the autoscaler queries (e.g. http://prometheus-operated.monitoring:9090);\n"
                     "empty: the autoscaler scrapes the runtime pods' /metrics directly.",
    "runtimeImage": "Runtime image of InferenceServices that set no spec.runtime.image.",
    "serviceMonitorMode": "Per-InferenceService ServiceMonitors made by the operator: auto (when the Prometheus\n"
                          "Operator's CRD is served), always, never. Set never to use monitoring.podMonitor instead.",
    "peering": "kopf peering: of several operator replicas only the highest-priority one acts. Creates the\n"
               "peering object (cluster-wide, or one per watched namespace). Disabled: --standalone.",
    "replicaCount": "Operator replicas (more than 1 needs peering).",
    "resources": "Operator container resources.",
    "serviceAccount": "The operator's ServiceAccount; its ClusterRole is kubeinfer.operator.rbac.RULES.",
    "rbac": "Create the operator's ClusterRole and ClusterRoleBinding.",
    "monitoring": "Optional monitoring objects; each needs the Prometheus Operator's CRDs or Grafana's sidecar.",
    "monitoring.podMonitor": "One PodMonitor for every runtime pod in every namespace (labels namespace, service, pod).",
    "monitoring.prometheusRule": "Alerts on the serving SLOs; runbooks in docs/guide.md.",
    "monitoring.alerts": "Alert thresholds. errorStatusCodes: regex of the status codes counted as errors.",
    "monitoring.dashboard": "ConfigMap holding the Grafana dashboard; the labels let Grafana's sidecar find it.",
    "monitoring.kubeStateMetrics": "ConfigMap with a kube-state-metrics custom-resource-state config (desired, ready and\n"
                                   "max replicas of InferenceServices) and read access for kube-state-metrics' account.",
}

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DNS = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}


def _object(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False, **extra}


SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "kubeinfer chart values",
    **_object({
        "image": _object({"repository": {"type": "string", "minLength": 1},
                          "tag": {"type": "string", "minLength": 1},
                          "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}}),
        "imagePullSecrets": {"type": "array", "items": _object({"name": _DNS})},
        "logLevel": {"enum": ["info", "debug"]},
        "watchNamespaces": {"type": "array", "uniqueItems": True,
                            "items": {"type": "string", "pattern": r"^[a-z0-9*?\[\]-]+$"}},
        "prometheusUrl": {"type": "string", "pattern": r"^(https?://[^\s]+)?$"},
        "runtimeImage": {"type": "string", "minLength": 1},
        "serviceMonitorMode": {"enum": ["auto", "always", "never"]},
        "peering": _object({"enabled": {"type": "boolean"}, "name": _DNS}),
        "replicaCount": {"type": "integer", "minimum": 0},
        "resources": {"type": "object", "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}},
                      "additionalProperties": False},
        "nodeSelector": _LABELS,
        "tolerations": {"type": "array", "items": {"type": "object"}},
        "affinity": {"type": "object"},
        "priorityClassName": {"type": "string"},
        "serviceAccount": _object({"create": {"type": "boolean"}, "name": _DNS, "annotations": _LABELS}),
        "rbac": _object({"create": {"type": "boolean"}}),
        "monitoring": _object({
            "runbookBaseUrl": {"type": "string", "pattern": r"^https?://"},
            "podMonitor": _object({"enabled": {"type": "boolean"},
                                   "interval": {"type": "string", "pattern": r"^[0-9]+(ms|s|m|h)$"},
                                   "labels": _LABELS}),
            "prometheusRule": _object({"enabled": {"type": "boolean"}, "labels": _LABELS}),
            "alerts": _object({
                "ttftP95Seconds": {"type": "number", "exclusiveMinimum": 0},
                "generationTokensPerSecondPerReplicaFloor": {"type": "number", "minimum": 0},
                "errorRatio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "errorStatusCodes": {"type": "string", "pattern": r"^[0-9.|()\[\]x-]+$"},
                "kvCacheUsageRatio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "queueDepthPerReplica": {"type": "number", "exclusiveMinimum": 0},
            }),
            "dashboard": _object({"enabled": {"type": "boolean"}, "labels": _LABELS}),
            "kubeStateMetrics": _object({"enabled": {"type": "boolean"},
                                         "serviceAccount": _object({"name": _DNS, "namespace": _DNS})}),
        }),
    }),
    # Two scrapes of the same pods would double every sum: the chart's PodMonitor needs the operator's
    # ServiceMonitors off; and more than one operator replica needs peering.
    "allOf": [
        {"if": {"properties": {"monitoring": {"properties": {"podMonitor": {"properties": {
            "enabled": {"const": True}}}}}}},
         "then": {"properties": {"serviceMonitorMode": {"const": "never"}}}},
        {"if": {"properties": {"replicaCount": {"minimum": 2}}},
         "then": {"properties": {"peering": {"properties": {"enabled": {"const": True}}}}}},
    ],
}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of user values over defaults: maps merge key by key, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_set(assignment: str) -> dict[str, Any]:
    """`a.b.c=value` (value parsed as YAML, like helm --set for scalars and [a,b] lists) to a nested dict."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path or "" in path.split("."):
        raise ValueError(f"--set wants key.path=value (e.g. monitoring.prometheusRule.enabled=true), "
                         f"not {assignment!r}")
    try:
        value: Any = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        raise ValueError(f"--set {assignment!r}: the value is not valid YAML (quote strings with special "
                         f"characters, e.g. key='[x'") from None
    for key in reversed(path.split(".")):
        value = {key: value}
    return value


def resolve(*overrides: dict[str, Any]) -> dict[str, Any]:
    """Defaults merged with each override in turn, then checked against the schema."""
    values = DEFAULTS
    for override in overrides:
        values = merge(values, override)
    _check_combinations(values)
    errors = sorted(jsonschema.Draft7Validator(SCHEMA).iter_errors(values), key=lambda e: list(e.path))
    if errors:
        raise ValueError("invalid values: " + "; ".join(
            f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in errors))
    return values


def _check_combinations(values: dict[str, Any]) -> None:
    """The schema's cross-field rules (allOf above), said in the user's terms before the schema's own words."""
    replicas = values.get("replicaCount")
    peering = values.get("peering")
    if isinstance(replicas, int) and replicas >= 2 and isinstance(peering, dict) and peering.get("enabled") is False:
        raise ValueError(f"invalid values: replicaCount={replicas} needs peering.enabled=true: several operator "
                         "copies coordinate through kopf peering (one acts, the others stand by)")
    monitoring = values.get("monitoring")
    pod_monitor = monitoring.get("podMonitor") if isinstance(monitoring, dict) else None
    if (isinstance(pod_monitor, dict) and pod_monitor.get("enabled") is True
            and values.get("serviceMonitorMode") != "never"):
        raise ValueError("invalid values: monitoring.podMonitor.enabled=true needs serviceMonitorMode=never: "
                         "the operator's ServiceMonitors would scrape the same pods twice and double every sum")


def values_yaml() -> str:
    """values.yaml: the defaults with their comments."""
    lines = ["# Default values of the kubeinfer chart. Generated by `python -m kubeinfer.operator.chart` from",
             "# kubeinfer.operator.chart_values; the schema is values.schema.json."]
    _emit(DEFAULTS, "", 0, lines)
    return "\n".join(lines) + "\n"


def _emit(node: dict[str, Any], prefix: str, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for key, value in node.items():
        path = f"{prefix}{key}"
        if path in COMMENTS:
            if indent == 0:
                lines.append("")
            lines.extend(f"{pad}# {line}" for line in COMMENTS[path].split("\n"))
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            _emit(value, path + ".", indent + 2, lines)
        else:
            lines.append(f"{pad}{key}: {json.dumps(value)}")
