"""spec.observability.tracing (and the operator's default collector) reaching the replicas and the router as the
OpenTelemetry SDK's standard variables (operator/spec/observability.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import builders, router
from kubeinfer.operator.spec import parse_spec

OWNER = builders.Owner(name="qwen", namespace="ml", uid="0000-1111")
COLLECTOR = "http://otel-collector.monitoring:4318"


def spec(**extra: Any):
    return parse_spec({"model": {"uri": "pvc://models/qwen"}, "router": {}, **extra})


def envs(parsed, config: OperatorConfig = OperatorConfig()) -> tuple[list[dict], list[dict]]:
    """(the runtime container's env, the router container's env)."""
    replica = builders.deployment(parsed, OWNER, config)["spec"]["template"]["spec"]["containers"][0]
    routing = router.deployment(parsed, OWNER, config)["spec"]["template"]["spec"]["containers"][0]
    return replica.get("env", []), routing.get("env", [])


def values(env: list[dict]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in env}


def test_no_collector_named_anywhere_leaves_tracing_off() -> None:
    for env in envs(spec()) + envs(spec(observability={"tracing": {"samplingRatio": 0.5}})):
        assert not [e for e in env if e["name"].startswith("OTEL_")]


def test_the_spec_s_collector_and_ratio_reach_the_replicas_and_the_router() -> None:
    for env in envs(spec(observability={"tracing": {"endpoint": COLLECTOR, "samplingRatio": 0.25}})):
        found = values(env)
        assert found["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR
        assert found["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert found["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert found["OTEL_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert found["OTEL_RESOURCE_ATTRIBUTES"] == ("k8s.pod.name=$(OTEL_POD_NAME),k8s.namespace.name="
                                                     "$(OTEL_POD_NAMESPACE),kubeinfer.inferenceservice=qwen")
        names = [e["name"] for e in env]   # the kubelet expands $(NAME) only from variables defined before
        assert names.index("OTEL_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
        assert names.index("OTEL_POD_NAMESPACE") < names.index("OTEL_RESOURCE_ATTRIBUTES")


def test_the_operator_s_default_applies_where_the_spec_names_none_and_the_spec_wins() -> None:
    config = OperatorConfig(tracing_endpoint="http://default:4318")
    for env in envs(spec(), config):
        assert values(env)["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://default:4318"
        assert values(env)["OTEL_TRACES_SAMPLER_ARG"] == "1"
    for env in envs(spec(observability={"tracing": {"endpoint": COLLECTOR}}), config):
        assert values(env)["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR
    assert OperatorConfig.from_env({"KUBEINFER_TRACING_ENDPOINT": COLLECTOR}).tracing_endpoint == COLLECTOR


def test_the_user_s_own_env_comes_after_and_so_overrides() -> None:
    parsed = spec(observability={"tracing": {"endpoint": COLLECTOR}},
                  runtime={"env": [{"name": "OTEL_SERVICE_NAME", "value": "chat-replicas"}]})
    names = [e["name"] for e in envs(parsed)[0]]
    assert names.index("OTEL_EXPORTER_OTLP_ENDPOINT") < names.index("OTEL_SERVICE_NAME")


@pytest.mark.parametrize("tracing", [{"endpoint": "otel-collector:4318"}, {"endpoint": "grpc://c:4317"},
                                     {"samplingRatio": 1.5}, {"samplingRatio": -0.1}, {"sampler": "always_on"}])
def test_a_bad_tracing_section_is_refused(tracing: dict) -> None:
    with pytest.raises(ValidationError):
        spec(observability={"tracing": tracing})
