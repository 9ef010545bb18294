"""The chart is generated from the same Python definitions as `kubeinfer manifests`, and renders to the same objects.

No Helm binary exists here: tests/charts/helm_subset.py renders the templates (only the syntax they use;
anything else raises), and the result must equal `kubeinfer.operator.manifests.render` for several value sets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kubeinfer import __version__
from kubeinfer.operator import chart, crd, manifests
from kubeinfer.operator.chart_values import DEFAULTS, SCHEMA, merge, parse_set, resolve

from kubeinfer_chart_helm_subset import Renderer, TemplateError

ROOT = Path(__file__).resolve().parents[2]

VALUE_SETS = {
    "defaults": {},
    "everything": {
        "logLevel": "debug", "watchNamespaces": ["ml", "ml-team-b"], "prometheusUrl": "http://prom.monitoring:9090",
        "serviceMonitorMode": "never", "replicaCount": 2, "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}], "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [
                {"key": "node-role", "operator": "In", "values": ["infra"]}]}}]}},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
        "monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}},
                       "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                       "alerts": {"ttftP95Seconds": 0.5, "errorStatusCodes": "5..|429"},
                       "dashboard": {"enabled": True},
                       "kubeStateMetrics": {"enabled": True}},
    },
    "minimal": {"peering": {"enabled": False}, "serviceAccount": {"create": False, "name": "existing"},
                "rbac": {"create": False}},
}


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def test_generated_chart_files_are_up_to_date(chart_dir: Path) -> None:
    stale = chart.stale_files(chart_dir)
    assert not stale, f"run `python -m kubeinfer.operator.chart`: stale {stale}"


def test_chart_crds_are_the_repository_crds(chart_dir: Path) -> None:
    for name in crd.render():
        assert (chart_dir / "crds" / name).read_text() == (ROOT / "crds" / name).read_text()


def test_chart_metadata_and_default_values(chart_dir: Path) -> None:
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["appVersion"] == meta["version"] == __version__
    assert yaml.safe_load((chart_dir / "values.yaml").read_text()) == DEFAULTS
    assert json.loads((chart_dir / "values.schema.json").read_text()) == SCHEMA


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_templates_render_to_the_plain_yaml_install(chart_dir: Path, name: str) -> None:
    values = resolve(VALUE_SETS[name])
    rendered = Renderer(chart_dir, values, "kubeinfer", "kubeinfer-system").objects()
    expected = [o for o in manifests.render(values) if o["kind"] not in ("CustomResourceDefinition", "Namespace")]
    assert sorted(map(key, rendered)) == sorted(map(key, expected))
    by_key = {key(o): o for o in expected}
    for obj in rendered:
        assert obj == by_key[key(obj)], f"template and manifests differ for {key(obj)}"


def test_monitoring_is_off_by_default_and_each_switch_adds_its_objects(chart_dir: Path) -> None:
    kinds = lambda values: sorted(o["kind"] for o in manifests.render(resolve(values)))  # noqa: E731
    base = kinds({})
    assert "PrometheusRule" not in base and "PodMonitor" not in base and "ConfigMap" not in base
    assert kinds({"monitoring": {"prometheusRule": {"enabled": True}}}) == sorted(base + ["PrometheusRule"])
    assert kinds({"serviceMonitorMode": "never", "monitoring": {"podMonitor": {"enabled": True}}}) == \
        sorted(base + ["PodMonitor"])
    assert kinds({"monitoring": {"dashboard": {"enabled": True}}}) == sorted(base + ["ConfigMap"])


BAD_VALUES = [
    ({"logLevel": "verbose"}, "logLevel"),
    ({"replicaCount": -1}, "replicaCount"),
    ({"replicaCount": "two"}, "replicaCount"),
    ({"imagee": {"tag": "x"}}, "imagee"),                          # a typo is refused, not ignored
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"prometheusUrl": "prometheus:9090"}, "prometheusUrl"),
    ({"serviceMonitorMode": "yes"}, "serviceMonitorMode"),
    ({"watchNamespaces": "ml"}, "watchNamespaces"),
    ({"monitoring": {"alerts": {"errorRatio": 2}}}, "errorRatio"),
    ({"monitoring": {"alerts": {"ttftP95Seconds": 0}}}, "ttftP95Seconds"),
    ({"monitoring": {"podMonitor": {"enabled": True}}}, "serviceMonitorMode"),  # double scrape
    ({"replicaCount": 2, "peering": {"enabled": False}}, "peering"),
    ({"serviceAccount": {"name": "Bad_Name"}}, "name"),
]


@pytest.mark.parametrize("override,field", BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_values_schema_refuses_bad_values(override: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        resolve(override)
    # The schema file Helm reads refuses it too, after Helm's merge with the defaults.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merge(DEFAULTS, override), SCHEMA, cls=jsonschema.Draft7Validator)


def test_values_schema_accepts_the_defaults_and_every_value_set() -> None:
    for values in VALUE_SETS.values():
        jsonschema.validate(merge(DEFAULTS, values), SCHEMA, cls=jsonschema.Draft7Validator)


def test_set_parses_like_helm_for_scalars_and_lists() -> None:
    assert parse_set("monitoring.alerts.ttftP95Seconds=0.5") == {"monitoring": {"alerts": {"ttftP95Seconds": 0.5}}}
    assert parse_set("watchNamespaces=[a,b]") == {"watchNamespaces": ["a", "b"]}
    with pytest.raises(ValueError):
        parse_set("novalue")


def test_manifests_command_applies_values_and_refuses_bad_ones(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("watchNamespaces: [ml]\nmonitoring:\n  prometheusRule:\n    enabled: true\n")
    cmd = [sys.executable, "-m", "kubeinfer.operator.manifests", "-f", str(values), "--set", "logLevel=debug"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    objs = list(yaml.safe_load_all(out))
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--verbose" in container["args"]
    assert {"name": "KUBEINFER_NAMESPACES", "value": "ml"} in container["env"]
    assert [o["metadata"]["namespace"] for o in objs if o["kind"] == "KopfPeering"] == ["ml"]
    assert any(o["kind"] == "PrometheusRule" for o in objs)
    bad = subprocess.run(cmd[:3] + ["--set", "logLevel=verbose"], capture_output=True, text=True)
    assert bad.returncode == 2 and "logLevel" in bad.stderr


def test_renderer_refuses_syntax_it_does_not_implement(chart_dir: Path) -> None:
    renderer = Renderer(chart_dir, DEFAULTS, "r", "ns")
    for text in ['{{ include "x" . }}', "{{ .Values.image | upper }}", "{{ with .Values.image }}x{{ end }}",
                 "{{ .Values.image }}"]:
        with pytest.raises(TemplateError):
            renderer.render_text(text)
    assert renderer.render_text("a\n  {{- if .Values.rbac.create }}\n  b{{ end }}") == "a\n  b"
    assert renderer.render_text("{{`{{`}} $labels.x {{`}}`}}") == "{{ $labels.x }}"
