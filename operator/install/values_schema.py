"""The schema of the Helm chart's values (charts/kubeinfer/values.schema.json is generated from it).

Helm checks every install and upgrade against it, after merging the user's values over values.yaml: an
unknown key, a wrong type or a value out of range is refused with the field's path before anything is
applied. values.yaml itself is written by hand in the chart (its comments are the values' documentation);
tests/charts checks that it passes this schema and that `helm lint --strict` accepts the chart.
"""

from __future__ import annotations

from typing import Any

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
        "tracing": _object({"endpoint": {"type": "string", "pattern": r"^(https?://[^\s/]+(/\S*)?)?$"}}),
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
