"""The install as Helm renders it (`kubeinfer manifests`: `helm template` after a Namespace) is valid Kubernetes
objects, and its alerts pass promtool. The static deploy/kubeinfer.yaml (the defaults) is checked without Helm.

Built-in kinds are checked against the Kubernetes OpenAPI schemas shipped offline by `kubernetes-validate`
(strict: unknown fields are errors). The kopf peering objects are checked against our own peering CRD. The
Prometheus Operator's kinds (PodMonitor, PrometheusRule) are checked against the subset of their CRD
schemas that we use, transcribed below (every field we set must be one of these, with these types).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kubeinfer.operator.install import crd, manifests, rbac

KUBERNETES_VERSIONS = ["1.27", "1.30", "1.33"]
PROMTOOL = shutil.which("promtool")

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": _STR_MAP,
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False,
        "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
# monitoring.coreos.com/v1 (prometheus-operator v0.7x), the fields kubeinfer sets.
PROMETHEUS_OPERATOR_SCHEMAS: dict[str, dict[str, Any]] = {
    "PodMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"}, "metadata": _META,
        "spec": {"type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
            "selector": _SELECTOR,
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "podMetricsEndpoints": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                "properties": {
                    "port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION,
                    "relabelings": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                        "properties": {
                            "sourceLabels": {"type": "array", "items": {"type": "string",
                                                                        "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                            "targetLabel": {"type": "string"}, "regex": {"type": "string"},
                            "replacement": {"type": "string"},
                            "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop",
                                                "labelmap", "LabelMap"]}}}}}}}}}}},
    "PrometheusRule": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"}, "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "properties": {
            "groups": {"type": "array", "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False, "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False, "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"type": "string"}, "for": _DURATION,
                            "labels": _STR_MAP, "annotations": _STR_MAP}}}}}}}}}},
}


@pytest.fixture(scope="module")
def install(helm: str) -> list[dict[str, Any]]:
    """Everything, monitoring included, as `kubeinfer manifests --monitoring --set watchNamespaces={ml}` prints it."""
    out = manifests.render(helm, manifests.CHART_DIR, sets=[*manifests.MONITORING_SETS, "watchNamespaces={ml}"])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def static_install() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifests.STATIC_PATH.read_text()) if doc]


def validate(obj: dict[str, Any], version: str) -> None:
    if obj["kind"] in PROMETHEUS_OPERATOR_SCHEMAS:
        jsonschema.validate(obj, PROMETHEUS_OPERATOR_SCHEMAS[obj["kind"]])
    elif obj["apiVersion"] == "kopf.dev/v1":
        peering = next(c for c in crd.peering_crds() if c["spec"]["names"]["kind"] == obj["kind"])
        jsonschema.validate(obj, peering["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        assert ("namespace" in obj["metadata"]) == (peering["spec"]["scope"] == "Namespaced")
    else:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_of_the_static_install_is_valid(version: str) -> None:
    objs = static_install()
    assert {o["kind"] for o in objs} == {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole",
                                         "ClusterRoleBinding", "Deployment", "ClusterKopfPeering"}
    for obj in objs:
        validate(obj, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid(install: list[dict[str, Any]], version: str) -> None:
    kinds = {o["kind"] for o in install}
    assert {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "Deployment", "KopfPeering", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    for obj in install:
        validate(obj, version)


def test_the_validation_catches_mistakes(install: list[dict[str, Any]]) -> None:
    """The checks above can fail: a misspelt field, a wrong type, a bad rule field are each refused."""
    deployment = copy.deepcopy(next(o for o in install if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment, "1.30")
    deployment = copy.deepcopy(next(o for o in install if o["kind"] == "Deployment"))
    deployment["spec"]["replicas"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment, "1.30")
    rule = copy.deepcopy(next(o for o in install if o["kind"] == "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["runbook"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule, "1.30")


def test_objects_reference_each_other(install: list[dict[str, Any]]) -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in install:
        by_kind.setdefault(obj["kind"], []).append(obj)
    namespace = by_kind["Namespace"][0]["metadata"]["name"]
    account = by_kind["ServiceAccount"][0]["metadata"]
    deployment = by_kind["Deployment"][0]
    pod = deployment["spec"]["template"]
    assert account["namespace"] == deployment["metadata"]["namespace"] == namespace
    assert pod["spec"]["serviceAccountName"] == account["name"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    roles = {r["metadata"]["name"]: r for r in by_kind["ClusterRole"]}
    for binding in by_kind["ClusterRoleBinding"]:
        assert binding["roleRef"]["name"] in roles
    operator_binding = next(b for b in by_kind["ClusterRoleBinding"]
                            if {"name": account["name"], "namespace": namespace, "kind": "ServiceAccount"}
                            in b["subjects"])
    assert roles[operator_binding["roleRef"]["name"]]["rules"] == rbac.RULES
    # CRDs come first: a single `kubectl apply -f` creates them before their objects.
    kinds = [o["kind"] for o in install]
    assert kinds.index("KopfPeering") > max(i for i, k in enumerate(kinds) if k == "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in by_kind["CustomResourceDefinition"]} == \
        {c["metadata"]["name"] for c in [crd.inference_service_crd(), *crd.peering_crds()]}


def test_operator_settings_reach_its_environment(install: list[dict[str, Any]], helm: str) -> None:
    """Every env var the chart sets is one the operator reads (kubeinfer.operator.config), or kopf's POD_ID."""
    from kubeinfer.operator.config import OperatorConfig
    import dataclasses
    known = {f"KUBEINFER_{f.name.upper()}" for f in dataclasses.fields(OperatorConfig)}
    standalone = [d for d in yaml.safe_load_all(manifests.render(helm, manifests.CHART_DIR,
                                                                  sets=["peering.enabled=false"])) if d]
    names = set()
    for objs in (install, standalone):
        deployment = next(o for o in objs if o["kind"] == "Deployment")
        names |= {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"KUBEINFER_STANDALONE", "KUBEINFER_PEERING"} <= names
    missing = names - known - {"POD_ID"}
    assert not missing, f"the operator reads no {missing}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not found (apt-get install -y prometheus)")
def test_promtool_accepts_the_rules(install: list[dict[str, Any]], tmp_path: Path) -> None:
    rule = next(o for o in install if o["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule['spec']['groups'][0]['rules'])} rules found" in result.stdout
    # And promtool is a real check: a broken expression fails.
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum by (namespace (x)"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    assert subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True).returncode != 0
