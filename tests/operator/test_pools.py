"""The pools of spec.disaggregation as pure builders build them: the decode pool's KV sources from the operator's
KUBEINFER_POD_NETWORKS, each pool's Deployment against the colocated one, and the ServiceMonitor's pool label."""

from __future__ import annotations

import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import builders, pools
from kubeinfer.operator.spec import parse_spec

OWNER = builders.Owner("q", "ns", "uid")
RAW = {"model": {"uri": "pvc://m/q"}, "router": {}, "resources": {"gpus": 0, "cpu": 1, "memory": "4Gi"},
       "disaggregation": {"prefill": {"replicas": 2}, "decode": {}}}


def args(dep: dict) -> list[str]:
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_decode_pods_take_kv_only_from_the_pod_networks_when_the_operator_knows_them() -> None:
    config = OperatorConfig.from_env({"KUBEINFER_POD_NETWORKS": "10.244.0.0/16, fd00:10:244::/56"})
    decode = builders.pool_deployment(parse_spec(RAW), OWNER, config, "decode")
    assert args(decode)[-4:] == ["--kv-role", "decode", "--kv-source-networks", "10.244.0.0/16,fd00:10:244::/56"]
    prefill = builders.pool_deployment(parse_spec(RAW), OWNER, config, "prefill")
    assert "--kv-source-networks" not in args(prefill)


def test_a_pod_network_that_is_not_one_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="KUBEINFER_POD_NETWORKS: '10.244.0.0/33' is not a network"):
        OperatorConfig.from_env({"KUBEINFER_POD_NETWORKS": "10.244.0.0/33"})


def test_a_pool_deployment_is_the_colocated_one_with_its_role_size_and_label() -> None:
    spec = parse_spec(RAW)
    prefill = builders.pool_deployment(spec, OWNER, OperatorConfig(), "prefill")
    colocated = builders.deployment(parse_spec({k: v for k, v in RAW.items() if k != "disaggregation"} |
                                               {"replicas": 2}), OWNER, OperatorConfig())
    assert args(prefill) == args(colocated) + ["--kv-role", "prefill", "--kv-port", "9100"]
    assert prefill["metadata"]["name"] == "q-prefill" and prefill["spec"]["replicas"] == 2
    assert prefill["spec"]["template"]["metadata"]["labels"] == {
        **colocated["spec"]["template"]["metadata"]["labels"], pools.POOL_LABEL: "prefill"}
    # The hash covers what changed (a hand edit of the pool label would be repaired).
    assert prefill["metadata"]["annotations"][builders.HASH_ANNOTATION] == builders.content_hash(prefill)


def test_the_service_monitor_copies_the_pool_label_only_with_disaggregation() -> None:
    [with_pools] = builders.service_monitor(parse_spec(RAW), OWNER)["spec"]["endpoints"]
    assert with_pools["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_label_kubeinfer_dev_pool"],
                                          "targetLabel": "pool", "action": "replace"}]
    [colocated] = builders.service_monitor(parse_spec({"model": {"uri": "pvc://m/q"}}), OWNER)["spec"]["endpoints"]
    assert "relabelings" not in colocated
