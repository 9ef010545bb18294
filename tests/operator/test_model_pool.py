"""spec.modelPool in the operator (reconcile.model_pool, reconcile.model_pool_status): the replicas run `kubeinfer
pool` with every model, whose flags the real command line parses; the router gets each model's port; checks the API
server cannot make; and the status read from the engines' /metrics (stand-in engines here; the real ones on the
cluster in tests/e2e/test_model_pool_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import builders, model_pool_status, router
from kubeinfer.operator.reconcile.validation import semantic_errors
from kubeinfer.operator.spec import parse_spec
from kubeinfer.runtime.cli import build_parser
from support.pool_engines import stand_in_engines

OWNER = builders.Owner(name="qwen", namespace="ml", uid="0000-1111")
POOL = {"models": [{"servedName": "sql", "uri": "pvc://models/sql"}, {"servedName": "demo", "uri": "file:///opt/d"}]}


def pool_spec(**extra: Any):
    return parse_spec({"model": {"uri": "pvc://models/qwen"}, "router": {}, "modelPool": POOL, **extra})


def runtime(spec) -> dict[str, Any]:
    return builders.deployment(spec, OWNER, OperatorConfig())["spec"]["template"]["spec"]["containers"][0]


def test_the_replicas_run_kubeinfer_pool_with_every_model_and_the_same_serve_flags():
    container = runtime(pool_spec(modelPool={**POOL, "maxAwake": 2, "sleepLevel": 2}, runtime={"maxNumSeqs": 7},
                                  resources={"gpus": 0, "memory": "8Gi"}))
    assert container["command"] == ["kubeinfer", "pool"]
    split = container["args"].index("--")
    pool_args = build_parser().parse_args(["pool", *container["args"]])
    assert pool_args.member == ["qwen=/models/qwen", "sql=/models/sql", "demo=/opt/d"]
    assert (pool_args.max_awake, pool_args.sleep_level, pool_args.port) == (2, 2, 8000)
    serve_args = build_parser().parse_args(["serve", "--model", "x", *container["args"][split + 1:]])
    assert serve_args.max_num_seqs == 7 and serve_args.device == "cpu"
    assert serve_args.kv_cache_memory_gib == 1.0   # a quarter of 8 GiB, shared by the two models awake at once
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8000), ("model-1", 8001),
                                                                            ("model-2", 8002)]


def test_the_router_gets_each_models_port_and_no_single_served_name():
    args = build_parser().parse_args(["router", *router.router_args(pool_spec(), OWNER)])
    assert args.pool_model == ["qwen=8000", "sql=8001", "demo=8002"]
    assert (args.pool_max_awake, args.pool_sleep_level, args.served_model_name) == (1, 1, None)


def test_without_a_pool_nothing_changes():
    container = runtime(parse_spec({"model": {"uri": "pvc://models/qwen"}}))
    assert container["command"] == ["kubeinfer", "serve"] and container["args"][:2] == ["--model", "/models/qwen"]
    assert [p["name"] for p in container["ports"]] == ["http"]


@pytest.mark.parametrize("pool, model, message", [
    ({"models": [{"servedName": "qwen", "uri": "file:///a"}]}, {"uri": "pvc://models/qwen"},
     "servedName 'qwen' is the first model's name"),
    ({"models": [{"servedName": "b", "uri": "pvc://other/b"}]}, {"uri": "pvc://models/qwen"},
     "a pvc:// model must be on the claim of spec.model's pvc:// URI (models)"),
    ({"models": [{"servedName": "b", "uri": "pvc://other/b"}]}, {"uri": "file:///opt/q"},
     "a pvc:// model must be on the claim of spec.model's pvc:// URI: a replica"),
])
def test_what_the_api_server_cannot_check_is_a_spec_error(pool, model, message):
    errors = semantic_errors(parse_spec({"model": model, "router": {}, "modelPool": pool}), "qwen")
    assert any(message in error for error in errors), errors


def test_the_status_says_which_models_are_awake_on_each_ready_replica():
    pods = [{"metadata": {"name": "qwen-1"}, "status": {"podIP": "127.0.0.1",
                                                        "conditions": [{"type": "Ready", "status": "True"}]}},
            {"metadata": {"name": "qwen-2"}, "status": {"podIP": "127.0.0.2",
                                                        "conditions": [{"type": "Ready", "status": "False"}]}}]
    with stand_in_engines([(1, 2), (0, 5)]) as (port, _):   # the pool's third engine does not answer
        status = model_pool_status.observe(pool_spec(), "qwen", port, pods)
    assert status == {"maxAwake": 1, "replicas": [{"pod": "qwen-1", "awake": ["sql"], "asleep": ["qwen"],
                                                   "wakeups": 2 + 5, "unreachable": ["demo"]}]}
