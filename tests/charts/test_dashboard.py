"""The Grafana dashboard is a well-formed dashboard JSON model, and every query (dashboard and alerts) names
only metrics that exist: the runtime's own registry, our kube-state-metrics config, or kube-state-metrics'
built-in Deployment series."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer.operator.install import dashboard, monitoring
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.server.metrics import EngineMetrics

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((ROOT / "charts" / "kubeinfer" / "values.yaml").read_text())   # the chart's values
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "text", "heatmap", "row"}
KSM_BUILTIN = {"kube_deployment_spec_replicas", "kube_deployment_status_replicas_ready"}
PROMQL_WORDS = {"sum", "by", "rate", "count", "max", "min", "avg", "and", "or", "on", "histogram_quantile",
                "avg_over_time", "label_replace", "label_values", "le", "unless", "group_left", "ignoring"}


def runtime_series_names() -> set[str]:
    """Every series name the runtime and its router can export (histograms: _bucket/_count/_sum; counters:
    _total)."""
    names = set()
    for family in [*EngineMetrics("m").registry.collect(), *RouterMetrics().registry.collect()]:
        kind = family.type
        if kind == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"}
        elif kind == "counter":
            names.add(f"{family.name}_total")
        else:
            names.add(family.name)
    return names


def ksm_series_names() -> set[str]:
    resource = monitoring.kube_state_metrics_config()["spec"]["resources"][0]
    return {f"{resource['metricNamePrefix']}_{m['name']}" for m in resource["metrics"]}


KNOWN = runtime_series_names() | ksm_series_names() | KSM_BUILTIN


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(kube(?:infer)?_[a-z0-9_]+)\b", expr))


def all_queries() -> list[tuple[str, str]]:
    out = [(f"alert {r['alert']}", r["expr"])
           for r in monitoring.rule_groups(DEFAULTS["monitoring"]["alerts"], "https://x")[0]["rules"]]
    for panel in dashboard.dashboard()["panels"]:
        out += [(f"panel {panel['title']}/{t['refId']}", t["expr"]) for t in panel["targets"]]
    for var in dashboard.dashboard()["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["definition"]))
    return out


@pytest.mark.parametrize("where,expr", all_queries(), ids=[w for w, _ in all_queries()])
def test_every_query_names_existing_metrics(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where} names no metric"
    assert names <= KNOWN, f"{where}: unknown metrics {names - KNOWN}"


def test_the_metric_check_would_catch_a_rename() -> None:
    renamed = "histogram_quantile(0.95, sum by (le) (rate(kubeinfer_ttft_seconds_bucket[5m])))"
    assert not metric_names(renamed) <= KNOWN
    assert "kubeinfer_time_to_first_token_seconds_bucket" in KNOWN and "kubeinfer_request_errors_total" in KNOWN


def test_dashboard_json_model(chart_dir: Path) -> None:
    board = json.loads((chart_dir / "files" / "kubeinfer-overview.json").read_text())
    assert board == dashboard.dashboard()
    for key in ("uid", "title", "schemaVersion", "panels", "templating", "time", "refresh"):
        assert key in board, key
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", board["uid"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for panel in board["panels"]:
        assert panel["type"] in PANEL_TYPES and panel["title"]
        assert panel["id"] not in ids
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        area = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not area & cells, f"panel {panel['title']} overlaps another"
        cells |= area
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= set(variables), f"{panel['title']} uses undefined variables {used - set(variables)}"


def test_dashboard_shows_what_a_serving_team_watches() -> None:
    exprs = " ".join(t["expr"] for p in dashboard.dashboard()["panels"] for t in p["targets"])
    for needed in ("histogram_quantile(0.5, sum by (service, le) (rate(kubeinfer_time_to_first_token_seconds_bucket",
                   "histogram_quantile(0.95, sum by (service, le) (rate(kubeinfer_time_to_first_token_seconds_bucket",
                   "kubeinfer_inter_token_latency_seconds_bucket", "kubeinfer_generation_tokens_total",
                   "kubeinfer_num_requests_waiting", "kubeinfer_kv_cache_usage_ratio",
                   "kubeinfer_prefix_cache_hits_total", "kubeinfer_num_preemptions_total",
                   "kubeinfer_inferenceservice_spec_replicas", "kubeinfer_inferenceservice_status_ready_replicas",
                   "sum by (status_code) (rate(kubeinfer_request_errors_total",
                   "sum by (tenant) (rate(kubeinfer_tenant_busy_seconds_total"):
        assert needed in exprs, needed


def test_the_cost_by_tenant_multiplies_busy_time_by_gpus_and_the_price_variable() -> None:
    board = dashboard.dashboard()
    [panel] = [p for p in board["panels"] if p["title"] == "Estimated cost by tenant"]
    [target] = panel["targets"]
    assert "kubeinfer_replica_accelerators" in target["expr"] and target["expr"].endswith("* $gpu_hour_price")
    [price] = [v for v in board["templating"]["list"] if v["name"] == "gpu_hour_price"]
    assert price["type"] == "textbox" and float(price["query"]) > 0 and panel["fieldConfig"]["defaults"]["unit"] == \
        "currencyUSD"


def test_every_alert_has_a_runbook_in_the_guide() -> None:
    guide = (ROOT / "docs" / "guide.md").read_text()
    for rule in monitoring.rule_groups({}, DEFAULTS["monitoring"]["runbookBaseUrl"])[0]["rules"]:
        base, anchor = rule["annotations"]["runbook_url"].split("#")
        assert base.endswith("docs/guide.md")
        assert f'<a id="{anchor}"></a>' in guide, f"docs/guide.md has no runbook for {rule['alert']}"
        assert rule["labels"]["severity"] in ("warning", "critical")
