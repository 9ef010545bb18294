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


def _file_of(pod_spec: dict, flag: str) -> tuple[str, dict]:
    """The path a container's `flag` names, and the Secret item the kubelet puts there (through the mounts)."""
    container = pod_spec["containers"][0]
    path = container["args"][container["args"].index(flag) + 1]
    folder, file = path.rsplit("/", 1)
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    [volume] = [v for v in pod_spec["volumes"] if v["name"] == mount["name"]]
    [item] = [i for i in volume["secret"]["items"] if i["path"] == file]
    return volume["secret"]["secretName"], item


def test_signed_kv_sources_mount_one_secret_key_in_the_router_and_the_decode_pods_only() -> None:
    from kubeinfer.operator.reconcile import router
    flag = "--kv-source-key-file"
    signed = parse_spec(RAW | {"disaggregation": RAW["disaggregation"] | {"kvSourceKeySecretRef": {"name": "kv"}}})
    decode = builders.pool_deployment(signed, OWNER, OperatorConfig(), "decode")["spec"]["template"]["spec"]
    router_pod = router.pod_spec(signed, OWNER, OperatorConfig())
    for pod_spec in (decode, router_pod):
        assert _file_of(pod_spec, flag) == ("kv", {"key": "kv-source-key", "path": "key"})
    prefill = builders.pool_deployment(signed, OWNER, OperatorConfig(), "prefill")["spec"]["template"]["spec"]
    assert flag not in prefill["containers"][0]["args"]
    assert not any("secret" in v for v in prefill["volumes"])
    unsigned = parse_spec(RAW)
    assert flag not in router.router_args(unsigned, OWNER)
    assert flag not in args(builders.pool_deployment(unsigned, OWNER, OperatorConfig(), "decode"))
