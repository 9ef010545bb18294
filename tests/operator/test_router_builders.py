"""Pure parts of the operator's router: its flags from the spec, which replicas it is told about, defaults."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import router
from kubeinfer.operator.reconcile.builders import Owner
from kubeinfer.operator.spec import parse_spec
from kubeinfer.runtime.cli import build_parser

OWNER = Owner(name="llama", namespace="team-a", uid="u1")


def spec(**extra):
    return parse_spec({"model": {"uri": "pvc://models/llama"}, **extra})


def pod(name: str, ip: str | None, ready: bool, deleting: bool = False) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {**({"podIP": ip} if ip else {}),
                                         "conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_ready_endpoints_are_ready_live_pods_with_an_address_sorted():
    pods = [pod("c", "10.0.0.3", True), pod("a", "10.0.0.1", True), pod("b", "10.0.0.2", False),
            pod("d", "10.0.0.4", True, deleting=True), pod("e", None, True)]
    urls = router.ready_endpoints(pods)
    assert urls == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    assert json.loads(router.endpoints_value(urls)) == urls
    assert router.endpoints_value([]) == "[]"   # known and empty: not the same as no annotation


def test_the_routers_flags_parse_with_the_real_command_line_and_carry_the_spec():
    s = spec(router={"policy": "least-load", "kvWeight": 0, "queueTimeoutSeconds": 7.5, "maxQueuedRequests": 9},
             model={"uri": "pvc://models/llama", "servedName": "llama-3"}, runtime={"drainTimeoutSeconds": 45})
    args = build_parser().parse_args(["router", *router.router_args(s, OWNER)])
    assert (args.endpoints_file, args.port, args.policy, args.kv_weight) == (router.ENDPOINTS_FILE, router.PORT,
                                                                             "least-load", 0.0)
    assert (args.queue_timeout, args.max_queued_requests, args.served_model_name) == (7.5, 9, "llama-3")
    assert args.drain_timeout_seconds == 45


def test_defaults_are_the_routers_own_and_off_means_no_children():
    s = spec(router={})
    assert s.router_enabled and s.router.replicas == 1
    args = build_parser().parse_args(["router", "--upstream", "http://a:1"])
    assert (s.router.prefix_weight, s.router.load_weight, s.router.kv_weight, s.router.footprint_weight,
            s.router.load_bound_epsilon, s.router.max_queued_requests, s.router.queue_timeout_seconds) == (
        args.prefix_weight, args.load_weight, args.kv_weight, args.footprint_weight, args.load_bound_epsilon,
        args.max_queued_requests, args.queue_timeout)
    assert router.children(spec(router={"enabled": False}), OWNER, OperatorConfig()) == []
    assert router.children(spec(), OWNER, OperatorConfig()) == []


def test_the_router_pod_runs_the_runtime_image_without_gpus_or_the_replicas_scheduling():
    s = spec(resources={"gpus": 1, "gpuProduct": "H100"}, runtime={"image": "example/rt:1"},
             scheduling={"nodeSelector": {"pool": "gpu"}}, router={})
    dep = router.deployment(s, OWNER, OperatorConfig())
    pod_spec = dep["spec"]["template"]["spec"]
    [container] = pod_spec["containers"]
    assert container["image"] == "example/rt:1"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert "nodeSelector" not in pod_spec and "tolerations" not in pod_spec
    # spread over nodes where possible: the preferred anti-affinity selects exactly the Deployment's own pods
    [term] = pod_spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert dep["metadata"]["name"] == "llama-router" and dep["metadata"]["namespace"] == "team-a"
    assert router.deployment(s, OWNER, OperatorConfig(runtime_image="x")) == dep   # pure: same spec, same object


@pytest.mark.parametrize("bad, where", [({"replicas": 0}, "replicas"), ({"loadWeight": -1}, "router.loadWeight"),
                                        ({"queueTimeoutSeconds": 0}, "router.queueTimeoutSeconds"),
                                        ({"policy": "random"}, "policy"), ({"colour": "red"}, "colour")])
def test_bad_router_fields_are_refused(bad, where):
    with pytest.raises(ValidationError, match=where):
        spec(router=bad)


def test_with_api_keys_the_router_reads_the_same_secret_for_tenants_and_caps_them():
    s = spec(router={"maxInFlightPerTenant": 16}, apiKeySecretRef={"name": "keys", "key": "list"})
    args = build_parser().parse_args(["router", *router.router_args(s, OWNER)])
    assert (args.api_keys_file, args.max_in_flight_per_tenant) == ("/etc/kubeinfer/api-keys/keys", 16)
    pod_spec = router.pod_spec(s, OWNER, OperatorConfig())
    assert {"name": "api-keys", "secret": {"secretName": "keys", "items": [{"key": "list", "path": "keys"}],
                                           "defaultMode": 0o440}} in pod_spec["volumes"]
    assert {"name": "api-keys", "mountPath": "/etc/kubeinfer/api-keys", "readOnly": True} in \
        pod_spec["containers"][0]["volumeMounts"]
    plain = build_parser().parse_args(["router", *router.router_args(spec(router={}), OWNER)])
    assert (plain.api_keys_file, plain.max_in_flight_per_tenant) == (None, None)


def test_with_tenants_the_router_reads_their_secret_and_takes_their_cap():
    s = spec(router={}, tenants={"secretRef": {"name": "teams"}, "maxInFlightPerTenant": 3})
    args = build_parser().parse_args(["router", *router.router_args(s, OWNER)])
    assert (args.api_keys_file, args.max_in_flight_per_tenant) == ("/etc/kubeinfer/api-keys/keys", 3)
    pod_spec = router.pod_spec(s, OWNER, OperatorConfig())
    assert {"name": "api-keys", "secret": {"secretName": "teams", "items": [{"key": "api-keys", "path": "keys"}],
                                           "defaultMode": 0o440}} in pod_spec["volumes"]
    uncapped = spec(router={"maxInFlightPerTenant": 5}, tenants={"secretRef": {"name": "teams"}})
    args = build_parser().parse_args(["router", *router.router_args(uncapped, OWNER)])
    assert (args.api_keys_file, args.max_in_flight_per_tenant) == ("/etc/kubeinfer/api-keys/keys", 5)
