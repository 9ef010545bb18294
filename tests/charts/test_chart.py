"""The chart, rendered by the real Helm (`helm template`, `helm lint --strict`), is the one source of the install.

- Its generated parts (CRDs from the spec models, values schema, ClusterRole rules, alerts, dashboard) are
  current; values.yaml passes the schema; `helm lint --strict` accepts the chart.
- Every value reaches the object it configures, the monitoring switches add their objects, and bad values are
  refused by Helm (values.schema.json) with the field named.
- `kubeinfer manifests` is `helm template` after a Namespace object; deploy/kubeinfer.yaml, what it prints
  without Helm, is that rendering of the defaults, fresh.
Tests that need Helm skip with a reason when it cannot be found (make install-test installs it).
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kubeinfer import __version__
from kubeinfer.operator.config import DEFAULT_RUNTIME_IMAGE
from kubeinfer.operator.install import chart, crd, manifests, monitoring, rbac
from kubeinfer.operator.install.values_schema import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
Render = Callable[..., list[dict[str, Any]]]

EVERYTHING = {
    "logLevel": "debug", "watchNamespaces": ["ml", "ml-team-b"], "prometheusUrl": "http://prom.monitoring:9090",
    "tracing": {"endpoint": "http://otel-collector.monitoring:4318"},
    "serviceMonitorMode": "never", "replicaCount": 2, "priorityClassName": "system-cluster-critical",
    "imagePullSecrets": [{"name": "regcred"}], "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "node-role", "operator": "In", "values": ["infra"]}]}}]}},
    "image": {"repository": "registry.example/kubeinfer/operator", "tag": "9.9.9", "pullPolicy": "Always"},
    "runtimeImage": "registry.example/kubeinfer/runtime:9.9.9",
    "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"memory": "600Mi"}},
    "serviceAccount": {"name": "ops", "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
    "monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}, "interval": "30s"},
                   "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                   "alerts": {"ttftP95Seconds": 0.5, "errorStatusCodes": "5..|429"},
                   "dashboard": {"enabled": True},
                   "kubeStateMetrics": {"enabled": True, "serviceAccount": {"name": "ksm", "namespace": "obs"}}},
}
MINIMAL = {"peering": {"enabled": False}, "serviceAccount": {"create": False, "name": "existing"},
           "rbac": {"create": False}}


def by_kind(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objs:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    [dep] = by_kind(objs)["Deployment"]
    return dep["spec"]["template"]["spec"]["containers"][0]


def env(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objs)["env"]}


def default_values() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "charts" / "kubeinfer" / "values.yaml").read_text())


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over values.yaml: maps merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_generated_chart_files_are_up_to_date(chart_dir: Path) -> None:
    stale = chart.stale_files(chart_dir)
    assert not stale, f"run `python -P -m kubeinfer.operator.chart`: stale {stale}"


def test_chart_crds_are_the_repository_crds(chart_dir: Path) -> None:
    for name in crd.render():
        assert (chart_dir / "crds" / name).read_text() == (ROOT / "crds" / name).read_text()


def test_chart_version_and_default_images(chart_dir: Path) -> None:
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["appVersion"] == meta["version"] == __version__
    values = default_values()
    assert values["image"] == {"repository": "ghcr.io/kubeinfer/operator", "tag": __version__,
                               "pullPolicy": "IfNotPresent"}
    assert values["runtimeImage"] == DEFAULT_RUNTIME_IMAGE
    # The alert thresholds' defaults are the monitoring module's (docs/guide.md's runbooks quote them).
    assert values["monitoring"]["alerts"] == monitoring.ALERT_DEFAULTS


def test_values_yaml_passes_its_schema_and_the_schema_is_no_formality() -> None:
    jsonschema.validate(default_values(), SCHEMA, cls=jsonschema.Draft7Validator)
    for values in (EVERYTHING, MINIMAL):
        jsonschema.validate(merge(default_values(), values), SCHEMA, cls=jsonschema.Draft7Validator)
    for override, _ in BAD_VALUES:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(merge(default_values(), override), SCHEMA, cls=jsonschema.Draft7Validator)


def test_helm_lint_strict(helm: str, chart_dir: Path, tmp_path: Path) -> None:
    for values in ({}, EVERYTHING, MINIMAL):
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        result = subprocess.run([helm, "lint", "--strict", str(chart_dir), "--values", str(path)],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    # --strict is a real check: a template that renders an undefined value fails it.
    broken = tmp_path / "chart"
    subprocess.run(["cp", "-r", str(chart_dir), str(broken)], check=True)
    (broken / "templates" / "broken.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
                                                      "  name: {{ .Values.noSuchValue.field }}\n")
    assert subprocess.run([helm, "lint", "--strict", str(broken)], capture_output=True).returncode != 0


def test_defaults_render_the_operator_with_its_rbac(render: Render) -> None:
    objs = render()
    kinds = by_kind(objs)
    assert sorted(kinds) == ["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                             "Deployment", "ServiceAccount"]
    [role], [binding], [account] = kinds["ClusterRole"], kinds["ClusterRoleBinding"], kinds["ServiceAccount"]
    assert role["rules"] == rbac.RULES
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "kubeinfer-operator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "kubeinfer-system"}]
    [dep] = kinds["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    c = container(objs)
    assert c["image"] == f"ghcr.io/kubeinfer/operator:{__version__}" and c["command"] == ["kubeinfer", "operator"]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert env(objs) == {"KUBEINFER_NAMESPACES": "", "KUBEINFER_RUNTIME_IMAGE": DEFAULT_RUNTIME_IMAGE,
                         "KUBEINFER_SERVICE_MONITOR": "auto", "KUBEINFER_PROMETHEUS_URL": "",
                         "KUBEINFER_TRACING_ENDPOINT": "",
                         "KUBEINFER_PEERING": "kubeinfer", "POD_ID": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert {c["metadata"]["name"] for c in kinds["CustomResourceDefinition"]} == \
        {c["metadata"]["name"] for c in [crd.inference_service_crd(), *crd.peering_crds()]}


@pytest.mark.parametrize("values", [{}, "everything", {"monitoring": {"kubeStateMetrics": {"enabled": True}}}])
def test_no_rule_grants_a_wildcard_or_any_secret_verb(render: Render, values: Any) -> None:
    """Least privilege (issue #56): every Role and ClusterRole the chart renders, with its defaults and with every
    switch on, names its groups, resources and verbs (no `*`) and grants nothing on Secrets. The Secrets services
    name are mounted by the kubelet; the operator reads none (docs/lora.md: replicas follow their adapters' list)."""
    objs = render(EVERYTHING if values == "everything" else values)
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    assert roles, "the chart rendered no RBAC"
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: a wildcard in {field}: {rule}"
            assert "secrets" not in rule.get("resources", []), f"{role['metadata']['name']} grants {rule}"
            assert not rule.get("nonResourceURLs"), f"{role['metadata']['name']} grants {rule}"
    assert not [r for r in rbac.RULES if "secrets" in r["resources"]]


def test_every_value_reaches_its_object(render: Render) -> None:
    objs = render(EVERYTHING, release="r", namespace="ops")
    kinds = by_kind(objs)
    [dep] = kinds["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    c = container(objs)
    assert dep["metadata"] == {**dep["metadata"], "name": "r-operator", "namespace": "ops"}
    assert dep["spec"]["replicas"] == 2 and "--verbose" in c["args"]
    assert c["image"] == "registry.example/kubeinfer/operator:9.9.9" and c["imagePullPolicy"] == "Always"
    assert c["resources"] == EVERYTHING["resources"]
    for key in ("priorityClassName", "imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert pod[key] == EVERYTHING[key], key
    assert env(objs) | {"POD_ID": None} == {
        "KUBEINFER_NAMESPACES": "ml,ml-team-b", "KUBEINFER_RUNTIME_IMAGE": "registry.example/kubeinfer/runtime:9.9.9",
        "KUBEINFER_SERVICE_MONITOR": "never", "KUBEINFER_PROMETHEUS_URL": "http://prom.monitoring:9090",
        "KUBEINFER_TRACING_ENDPOINT": "http://otel-collector.monitoring:4318",
        "KUBEINFER_PEERING": "kubeinfer", "POD_ID": None}
    [account] = kinds["ServiceAccount"]
    assert account["metadata"]["name"] == pod["serviceAccountName"] == "ops"
    assert account["metadata"]["annotations"] == EVERYTHING["serviceAccount"]["annotations"]
    assert sorted(p["metadata"]["namespace"] for p in kinds["KopfPeering"]) == ["ml", "ml-team-b"]
    assert "ClusterKopfPeering" not in kinds
    [pod_monitor] = kinds["PodMonitor"]
    assert pod_monitor["metadata"]["labels"]["release"] == "prom"
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    [rule] = kinds["PrometheusRule"]
    exprs = {r["alert"]: r["expr"] for r in rule["spec"]["groups"][0]["rules"]}
    assert "> 0.5" in exprs["KubeinferTTFTP95High"] and 'status_code=~"5..|429"' in exprs["KubeinferErrorRateHigh"]
    assert "{{ $labels.namespace }}" in json.dumps(rule)   # Prometheus' own templates pass through Helm untouched
    maps = {m["metadata"]["name"]: m for m in kinds["ConfigMap"]}
    assert json.loads(maps["r-dashboard"]["data"][chart.DASHBOARD_FILE]) == json.loads(chart.dashboard_json())
    assert yaml.safe_load(maps["r-kube-state-metrics"]["data"][chart.KSM_CONFIG_FILE]) == \
        yaml.safe_load(chart.ksm_config_yaml())
    ksm_binding = next(b for b in kinds["ClusterRoleBinding"] if b["metadata"]["name"] == "r-kube-state-metrics")
    assert ksm_binding["subjects"] == [{"kind": "ServiceAccount", "name": "ksm", "namespace": "obs"}]


def test_minimal_values_bring_your_own_account_and_no_peering(render: Render) -> None:
    objs = render(MINIMAL)
    kinds = by_kind(objs)
    assert sorted(kinds) == ["CustomResourceDefinition", "Deployment"]
    assert kinds["Deployment"][0]["spec"]["template"]["spec"]["serviceAccountName"] == "existing"
    assert env(objs)["KUBEINFER_STANDALONE"] == "true" and "KUBEINFER_PEERING" not in env(objs)


def test_monitoring_is_off_by_default_and_each_switch_adds_its_objects(render: Render) -> None:
    kinds = lambda values: sorted(o["kind"] for o in render(values))  # noqa: E731
    base = kinds({})
    assert "PrometheusRule" not in base and "PodMonitor" not in base and "ConfigMap" not in base
    assert kinds({"monitoring": {"prometheusRule": {"enabled": True}}}) == sorted(base + ["PrometheusRule"])
    assert kinds({"serviceMonitorMode": "never", "monitoring": {"podMonitor": {"enabled": True}}}) == \
        sorted(base + ["PodMonitor"])
    assert kinds({"monitoring": {"dashboard": {"enabled": True}}}) == sorted(base + ["ConfigMap"])
    assert kinds({"monitoring": {"kubeStateMetrics": {"enabled": True}}}) == \
        sorted(base + ["ClusterRole", "ClusterRoleBinding", "ConfigMap"])


BAD_VALUES = [
    ({"logLevel": "verbose"}, "logLevel"),
    ({"replicaCount": -1}, "replicaCount"),
    ({"replicaCount": "two"}, "replicaCount"),
    ({"imagee": {"tag": "x"}}, "imagee"),                          # a typo is refused, not ignored
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"prometheusUrl": "prometheus:9090"}, "prometheusUrl"),
    ({"tracing": {"endpoint": "otel-collector:4318"}}, "endpoint"),
    ({"serviceMonitorMode": "yes"}, "serviceMonitorMode"),
    ({"watchNamespaces": "ml"}, "watchNamespaces"),
    ({"monitoring": {"alerts": {"errorRatio": 2}}}, "errorRatio"),
    ({"monitoring": {"alerts": {"ttftP95Seconds": 0}}}, "ttftP95Seconds"),
    ({"monitoring": {"podMonitor": {"enabled": True}}}, "serviceMonitorMode"),  # double scrape
    ({"replicaCount": 2, "peering": {"enabled": False}}, "peering"),
    ({"serviceAccount": {"name": "Bad_Name"}}, "name"),
]


@pytest.mark.parametrize("override,field", BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_helm_refuses_bad_values_naming_the_field(render: Render, override: dict[str, Any], field: str) -> None:
    with pytest.raises(manifests.ManifestsError, match=field):
        render(override)


def test_the_static_install_is_helm_template_of_the_defaults(helm: str) -> None:
    """deploy/kubeinfer.yaml is fresh: regenerate with `python -P -m kubeinfer.operator.manifests --write`."""
    assert manifests.STATIC_PATH.read_text() == manifests.static_text(), \
        "stale deploy/kubeinfer.yaml: run `.venv/bin/python -P -m kubeinfer.operator.manifests --write`"


def run_manifests(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "kubeinfer.operator.manifests", *args],
                          capture_output=True, text=True)


def test_manifests_command_renders_the_chart_with_values(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("watchNamespaces: [ml]\nmonitoring:\n  prometheusRule:\n    enabled: true\n")
    out = run_manifests("-f", str(values), "--set", "logLevel=debug", "-n", "ops")
    assert out.returncode == 0, out.stderr
    objs = [o for o in yaml.safe_load_all(out.stdout) if o]
    assert objs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}
    assert "--verbose" in container(objs)["args"] and env(objs)["KUBEINFER_NAMESPACES"] == "ml"
    assert [o["metadata"]["namespace"] for o in objs if o["kind"] == "KopfPeering"] == ["ml"]
    assert any(o["kind"] == "PrometheusRule" for o in objs)
    bad = run_manifests("--set", "logLevel=verbose")
    assert bad.returncode == 2 and "logLevel" in bad.stderr and "Traceback" not in bad.stderr


def test_manifests_without_helm_prints_the_static_file_and_refuses_values(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(manifests, "find_helm", lambda: None)
    out = io.StringIO()
    with redirect_stdout(out):
        manifests.main([])
    assert out.getvalue() == manifests.STATIC_PATH.read_text()
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert docs[0]["kind"] == "Namespace" and {"Deployment", "CustomResourceDefinition"} <= {d["kind"] for d in docs}
    with pytest.raises(SystemExit) as exit_info:
        manifests.main(["--set", "logLevel=debug"])
    assert exit_info.value.code == 2 and "Helm was not found" in capsys.readouterr().err
