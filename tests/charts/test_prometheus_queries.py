"""Every alert expression and every dashboard query, run on a real Prometheus (Debian's 2.42) scraping real
runtimes (`kubeinfer serve --model demo`, two pods of one service) on 127.0.0.1.

The scrape config attaches the target labels the operator's ServiceMonitor (or the chart's PodMonitor) gives:
`namespace`, `service` (the InferenceService) and `pod`. Operator state (desired/ready/max replicas) comes from
a STAND-IN process that serves kube-state-metrics-shaped series (`kubeinfer_inferenceservice_*` as our
custom-resource-state config names them, and KSM's `kube_deployment_*`), scraped with honor_labels as KSM is.

Checks: Prometheus loads the rule file and evaluates every rule without error; each alert's signal returns
data; each alert fires when its threshold is set to trip; each dashboard target and variable returns data.
A renamed metric therefore fails here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubeinfer.operator.install import dashboard, monitoring
from kubeinfer.runtime.demo import build_demo_model
from support import PROMETHEUS_BIN, Prometheus, RuntimeServer, free_port, static_targets, stop_process, wait_for

NAMESPACE, SERVICE = "ns1", "svc-a"
MODEL = "demo-model-v1"
# Thresholds that make every alert fire with the load below (errors: the 404s it sends).
TRIPPING = {"ttftP95Seconds": 0, "generationTokensPerSecondPerReplicaFloor": 1e9, "errorRatio": 0,
            "errorStatusCodes": "4..", "kvCacheUsageRatio": 0, "queueDepthPerReplica": -1}

KSM_STAND_IN = textwrap.dedent("""
    import sys
    from prometheus_client import CollectorRegistry, Gauge, start_http_server
    reg = CollectorRegistry()
    crs = dict(customresource_group="kubeinfer.dev", customresource_kind="InferenceService",
               customresource_version="v1alpha1", namespace="ns1", inferenceservice="svc-a")
    for name, value in [("spec_replicas", 2), ("status_replicas", 2), ("status_ready_replicas", 1),
                        ("spec_autoscaling_max_replicas", 2), ("spec_autoscaling_min_replicas", 1),
                        ("status_predictive_arrival_rate", 1.5), ("status_predictive_forecast_high", 2.0)]:
        Gauge("kubeinfer_inferenceservice_" + name, name, list(crs), registry=reg).labels(**crs).set(value)
    for name, value in [("kube_deployment_spec_replicas", 2), ("kube_deployment_status_replicas_ready", 1)]:
        Gauge(name, name, ["namespace", "deployment"], registry=reg).labels("ns1", "svc-a").set(value)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    print(server.server_port, flush=True)
    sys.stdin.read()
""")

pytestmark = pytest.mark.skipif(PROMETHEUS_BIN is None, reason="prometheus not found (apt-get install -y prometheus)")


def _complete(runtime: RuntimeServer, prompt: str, max_tokens: int, model: str = MODEL) -> int:
    return runtime.complete(prompt, max_tokens, model=model).status_code


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two runtime pods of svc-a (the second with a tiny KV cache, so it preempts), the KSM stand-in and
    Prometheus scraping them every second with the alert rules loaded."""
    tmp = tmp_path_factory.mktemp("prometheus-fleet")
    runtimes: list[RuntimeServer] = []
    ksm = prometheus = router = None
    try:
        model = tmp / "demo"
        build_demo_model(model)   # here, once: both runtimes then start at the same time
        first = RuntimeServer(model, tmp / "runtime-0.log", "--device", "cpu", served_model_name=MODEL)
        runtimes.append(first)
        second = RuntimeServer(model, tmp / "runtime-1.log", "--device", "cpu", "--num-kvcache-blocks", "12",
                               served_model_name=MODEL)
        runtimes.append(second)
        first.wait_ready()
        ksm = subprocess.Popen([sys.executable, "-c", KSM_STAND_IN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
        ksm_port = int(ksm.stdout.readline())
        second.wait_ready()
        router_port = free_port()
        router = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "router", "--host", "127.0.0.1",
                                   "--port", str(router_port), "--upstream", f"http://127.0.0.1:{first.port}",
                                   "--upstream", f"http://127.0.0.1:{second.port}"],
                                  stdout=(tmp / "router.log").open("w"), stderr=subprocess.STDOUT)

        def router_up() -> bool:
            try:
                return "kubeinfer_router_replicas_up 2.0" in httpx.get(f"http://127.0.0.1:{router_port}/metrics").text
            except httpx.HTTPError:
                return False
        def router_up_or_exited() -> bool:
            assert router.poll() is None, (tmp / "router.log").read_text()[-3000:]
            return router_up()
        wait_for(router_up_or_exited, 120, "the router with both replicas up")

        rules = tmp / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": monitoring.rule_groups({}, "https://example/guide.md")}))
        prometheus = Prometheus(tmp / "prometheus", [
            {"job_name": "kubeinfer-runtime",
             "static_configs": static_targets([first.port, second.port], NAMESPACE, SERVICE)},
            # The operator's router: its Service is SERVICE-router (spec.router).
            {"job_name": "kubeinfer-router",
             "static_configs": static_targets([router_port], NAMESPACE, f"{SERVICE}-router")},
            {"job_name": "kube-state-metrics", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ksm_port}"]}]}], rule_files=[rules])
        prometheus.wait_until("sum(up)", 4)
        yield {"url": prometheus.url, "prometheus": prometheus, "runtimes": (first, second),
               "router": f"http://127.0.0.1:{router_port}"}
    finally:
        if prometheus is not None:
            prometheus.stop()
        if ksm is not None:
            ksm.stdin.close()
            stop_process(ksm)
        if router is not None:
            stop_process(router)
        for runtime in runtimes:
            runtime.stop()


def _through_router(router: str, prompt: str) -> int:
    return httpx.post(f"{router}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4},
                      timeout=60).status_code


def _load_phase(first: RuntimeServer, second: RuntimeServer, router: str) -> None:
    shared = "The key and value cache keeps the attention state of every token already seen. " * 2
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: _complete(first, shared + str(i), 12), range(4)))
        statuses += list(pool.map(lambda i: _through_router(router, shared + f" routed {i}"), range(4)))
        # Six concurrent long requests on 12 KV blocks of 16 tokens: the scheduler must preempt.
        statuses += list(pool.map(lambda i: _complete(second, f"request {i}: " + shared, 80), range(6)))
    assert set(statuses) == {200}, statuses
    assert _complete(first, "x", 1, model="no-such-model") == 404
    assert _complete(second, "x", 1, model="no-such-model") == 404


@pytest.fixture(scope="module")
def loaded(fleet: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Two load phases a few scrapes apart (so every counter has an increase inside the windows), then a
    steady trickle while the queries run (so gauges like running/KV usage are non-zero in some samples)."""
    first, second = fleet["runtimes"]
    prometheus: Prometheus = fleet["prometheus"]
    _load_phase(first, second, fleet["router"])
    prometheus.wait_rounds(2)   # scraped between the phases: every counter increases inside the windows
    _load_phase(first, second, fleet["router"])
    stop = threading.Event()

    def trickle() -> None:
        for i in range(400):
            if stop.is_set():
                return
            _complete(first, f"trickle {i}", 24)
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    prometheus.wait_rounds(3)
    try:
        yield fleet
    finally:
        stop.set()
        thread.join(timeout=60)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=60).json()
    assert body["status"] == "success", f"{promql}\n-> {body}"
    return body["data"]["result"]


ALERTS = [a.name for a in monitoring.ALERTS]


def _rule(values: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in monitoring.rule_groups(values, "https://x")[0]["rules"] if r["alert"] == name)


@pytest.mark.parametrize("name", ALERTS)
def test_alert_signal_has_data_and_expression_runs(loaded: dict[str, Any], name: str) -> None:
    alert = next(a for a in monitoring.ALERTS if a.name == name)
    values = dict(monitoring.ALERT_DEFAULTS)
    signal = query(loaded["url"], alert.signal.format(**{**values, "errorStatusCodes": "4.."}))
    assert signal, f"{name}: its signal returned no series"
    labels = signal[0]["metric"]
    # Grouped by what the runbook names: the service (or, from kube-state-metrics, the InferenceService).
    assert labels.get("namespace") == NAMESPACE
    assert SERVICE in (labels.get("service"), labels.get("inferenceservice"), labels.get("deployment"))
    query(loaded["url"], _rule(values, name)["expr"])  # with the defaults: runs (fires or not)


@pytest.mark.parametrize("name", ALERTS)
def test_alert_fires_when_its_threshold_trips(loaded: dict[str, Any], name: str) -> None:
    def fired() -> list[dict[str, Any]]:
        return query(loaded["url"], _rule(TRIPPING, name)["expr"])
    assert loaded["prometheus"].wait_for(fired, f"{name} to fire", rounds=10), name


def test_prometheus_evaluates_every_rule_without_error(loaded: dict[str, Any]) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        groups = httpx.get(f"{loaded['url']}/api/v1/rules", timeout=60).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else None
    rules = loaded["prometheus"].wait_for(evaluated, "the rules to be evaluated", rounds=10)
    assert sorted(r["name"] for r in rules) == sorted(ALERTS)
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    # With the stand-in's desired 2 = max 2 and ready 1 < 2, these two are pending or firing already.
    states = {r["name"]: r["state"] for r in rules}
    assert states["KubeinferReplicasAtMax"] in ("pending", "firing")
    assert states["KubeinferPodsNotReady"] in ("pending", "firing")


def _dashboard_promql(expr: str) -> str:
    return (expr.replace("$__rate_interval", "1m").replace("$namespace", ".*").replace("$service", ".*")
            .replace("$model", ".*").replace("$gpu_hour_price", dashboard.GPU_HOUR_PRICE))


PANEL_TARGETS = [(p["title"], t["refId"], t["expr"]) for p in dashboard.dashboard()["panels"] for t in p["targets"]]


@pytest.mark.parametrize("title,ref,expr", PANEL_TARGETS, ids=[f"{t}/{r}" for t, r, _ in PANEL_TARGETS])
def test_dashboard_query_returns_data(loaded: dict[str, Any], title: str, ref: str, expr: str) -> None:
    result = query(loaded["url"], _dashboard_promql(expr))
    assert result, f"panel {title!r} target {ref} returned no data: {expr}"


def test_dashboard_variables_list_the_fleet(loaded: dict[str, Any]) -> None:
    expected = {"namespace": NAMESPACE, "service": SERVICE, "model": MODEL}
    for var in dashboard.dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        inner = var["definition"][len("label_values("):-1]
        series, label = (part.strip() for part in inner.rsplit(",", 1))
        response = httpx.get(f"{loaded['url']}/api/v1/label/{label}/values",
                             params={"match[]": _dashboard_promql(series)}, timeout=60).json()
        assert response["status"] == "success" and expected[var["name"]] in response["data"], (var["name"], response)


@pytest.mark.parametrize("name", ["prompt_tokens", "generation_tokens"])
def test_per_tenant_token_counters_add_up_to_the_totals(loaded: dict[str, Any], name: str) -> None:
    """At one evaluation, per pod: the tenant series (here all `anonymous`: the fleet has no keys file) sum to the
    total series of the same scrape, and both have counted something."""
    url, sel = loaded["prometheus"].url, f'namespace="{NAMESPACE}", service="{SERVICE}"'
    totals = query(url, f"sum by (pod) (kubeinfer_{name}_total{{{sel}}})")
    assert len(totals) == 2 and all(float(series["value"][1]) > 0 for series in totals)
    # One expression: both sides read the same instant (the trickle keeps counting between two queries)
    gaps = query(url, f"sum by (pod) (kubeinfer_tenant_{name}_total{{{sel}}}) - "
                      f"sum by (pod) (kubeinfer_{name}_total{{{sel}}})")
    assert len(gaps) == 2 and all(float(series["value"][1]) == 0 for series in gaps), gaps


def test_per_tenant_busy_seconds_add_up_to_the_engines_step_time(loaded: dict[str, Any]) -> None:
    """At one evaluation, per pod: each engine step's time, shared out by the tokens each tenant computed in it, sums
    to the step-time histogram's sum (floating point aside: the shares are added in another order)."""
    url, sel = loaded["prometheus"].url, f'namespace="{NAMESPACE}", service="{SERVICE}"'
    pairs = query(url, f"sum by (pod) (kubeinfer_tenant_busy_seconds_total{{{sel}}}) / "
                       f"sum by (pod) (kubeinfer_engine_step_seconds_sum{{{sel}}})")
    assert len(pairs) == 2 and all(abs(float(series["value"][1]) - 1) < 1e-9 for series in pairs), pairs
    busy = query(url, f"sum by (pod) (kubeinfer_tenant_busy_seconds_total{{{sel}}})")
    assert len(busy) == 2 and all(float(series["value"][1]) > 0 for series in busy), busy
