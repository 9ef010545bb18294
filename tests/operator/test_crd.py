"""The CRD on disk matches the spec models, declares every status field, and validates like pydantic."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from kubeinfer.operator import spec
from kubeinfer.operator.install import crd
from kubeinfer.operator.reconcile import status

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _version() -> dict[str, Any]:
    return crd.inference_service_crd()["spec"]["versions"][0]


def _schema() -> dict[str, Any]:
    return _version()["schema"]["openAPIV3Schema"]


def _rules(node: Any) -> list[dict[str, str]]:
    """Every CEL rule anywhere in a schema."""
    found: list[dict[str, str]] = []
    if isinstance(node, dict):
        found += node.get("x-kubernetes-validations", [])
        for value in node.values():
            found += _rules(value)
    elif isinstance(node, list):
        for value in node:
            found += _rules(value)
    return found


def test_crds_on_disk_are_current() -> None:
    stale = crd.stale_files(ROOT / "crds")
    assert stale == [], f"regenerate with: python -m kubeinfer.operator.crd ({stale})"


def test_check_command_reports_stale_files(tmp_path: Path) -> None:
    assert crd.main(["--check", "--out", str(tmp_path)]) == 1
    assert crd.main(["--out", str(tmp_path)]) == 0
    assert crd.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / crd.CRD_FILE).write_text((tmp_path / crd.CRD_FILE).read_text().replace("infsvc", "isvc"))
    assert crd.main(["--check", "--out", str(tmp_path)]) == 1


def test_identity_scale_and_columns() -> None:
    doc = crd.inference_service_crd()
    assert doc["metadata"]["name"] == "inferenceservices.kubeinfer.dev"
    assert doc["spec"]["scope"] == "Namespaced"
    assert doc["spec"]["names"]["kind"] == "InferenceService"
    assert doc["spec"]["names"]["shortNames"] == ["infsvc"]
    version = _version()
    assert version["name"] == "v1alpha1" and version["storage"] and version["served"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.uri"
    assert columns["TP"] == ".spec.parallelism.tensor"
    assert columns["Desired"] == ".status.desiredReplicas"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Status"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert columns["Endpoint"] == ".status.endpoint"
    assert columns["TTFT-P95"] == ".status.ttftP95Seconds"
    assert columns["Queue"] == ".status.queueDepth"
    assert columns["Age"] == ".metadata.creationTimestamp"
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert default == ["Ready", "Desired", "Status", "Model", "Age"]
    assert wide[:2] == ["TP", "Endpoint"]


def test_columns_are_never_blank() -> None:
    """DESIRED reads a status field the operator always writes (test_status); TP a spec field the API server
    defaults, its parent object included (a default applies only inside an object that exists)."""
    props = _schema()["properties"]["spec"]["properties"]
    assert props["parallelism"]["default"] == {} and props["parallelism"]["properties"]["tensor"]["default"] == 1
    assert "desiredReplicas" in status.OWN_FIELDS


def test_a_negative_replica_count_is_refused_once() -> None:
    """The scale subresource refuses spec.replicas < 0 itself (".spec.replicas: ... should be a non-negative
    integer"): no schema minimum and no CEL rule says it again (checked on a real API server in
    tests/e2e/test_kubectl.py)."""
    props = _schema()["properties"]["spec"]["properties"]
    assert "minimum" not in props["replicas"] and _version()["subresources"]["scale"]["specReplicasPath"] == \
        ".spec.replicas"
    in_bounds = next(r for r in _rules(_schema()) if "spec.replicas must lie within" in r["message"])
    assert "self.replicas < 0 ||" in in_bounds["rule"]
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        spec.parse_spec({"model": {"uri": "hf://org/model"}, "replicas": -3})


def _assert_structural(node: dict[str, Any], where: str = "") -> None:
    """Every node has a type (or int-or-string / preserve-unknown), no refs, no anyOf, no titles."""
    assert "$ref" not in node and "anyOf" not in node and "title" not in node, where
    assert "type" in node or node.get("x-kubernetes-int-or-string"), where
    if node.get("additionalProperties") is not None:
        assert isinstance(node["additionalProperties"], dict), where
    for name, sub in (node.get("properties") or {}).items():
        _assert_structural(sub, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        _assert_structural(node["items"], f"{where}[]")


def test_schema_is_structural() -> None:
    _assert_structural(_schema())


def test_every_status_field_is_declared() -> None:
    declared = set(_schema()["properties"]["status"]["properties"])
    written = set(status.OWN_FIELDS)
    # What the autoscaler writes (DESIGN.md): the last observed signals.
    written |= {"queueDepth", "ttftP95Seconds", "tokensPerSecond"}
    assert written <= declared
    condition = _schema()["properties"]["status"]["properties"]["conditions"]["items"]["properties"]
    assert {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"} <= set(condition)


def test_autoscaling_fields_match_the_contract() -> None:
    fields = set(_schema()["properties"]["spec"]["properties"]["autoscaling"]["properties"])
    assert fields == {
        "policy", "minReplicas", "maxReplicas", "targetQueueDepthPerReplica", "targetTTFTP95Seconds", "targetITLP95Seconds",
        "metricWindowSeconds",
        "scaleUpStabilizationSeconds", "scaleDownStabilizationSeconds", "maxScaleUpStep", "maxScaleDownStep",
        "scaleToZeroIdleSeconds", "initialDelaySeconds", "tolerance", "throughputPerReplica", "routerMetricsUrl"}


def test_cel_rules_carry_messages_for_the_documented_mistakes() -> None:
    messages = " | ".join(r["message"] for r in _rules(_schema()))
    assert "minReplicas must not exceed" in messages
    assert "power of two" in messages
    assert "hf://, pvc://, s3:// or file://" in messages
    assert "spec.replicas must lie within" in messages
    assert "resources.gpus must be 0 (run on CPU)" in messages
    assert "resources.gpuProduct needs GPUs" in messages
    assert "runtime.gpuMemoryUtilization applies to GPUs" in messages
    assert "runtime.speculative.ngramMin must not exceed runtime.speculative.ngramMax" in messages
    assert "draftModelPath is needed with method draft" in messages
    assert "method draft runs with parallelism.tensor 1 only" in messages
    assert "parallelism.expert must be 1, equal parallelism.tensor" in messages
    assert "model.cacheHostPath and model.cacheVolumeClaim are exclusive" in messages
    assert "model.cacheHostPath caches downloads" in messages
    assert "runtime.compileCache.hostPath and runtime.compileCache.volumeClaim are exclusive" in messages
    assert "tenants.secretRef and apiKeySecretRef both name the API keys' Secret: give one" in messages
    assert "with spec.tenants the replicas' waiting queue follows tenants.schedulingPolicy" in messages
    assert "tenants.maxInFlightPerTenant is enforced by the router" in messages
    assert "set maxInFlightPerTenant once: in tenants or in router, not both" in messages
    assert "spec.disaggregation needs spec.router" in messages
    assert "disaggregation.decode.replicas must be above 0 while disaggregation.prefill.replicas is" in messages
    assert "spec.replicas and spec.autoscaling do not apply with spec.disaggregation" in messages
    for rule in _rules(_schema()):
        assert rule["rule"] and rule["message"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_schema_and_models(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == spec.API_VERSION and doc["kind"] == spec.KIND
    # The v3.0 schema (boolean exclusiveMinimum) is Draft 4 JSON Schema as far as these keywords go.
    jsonschema.Draft4Validator(_schema()).validate(doc)
    spec.parse_spec(doc["spec"])


BAD_SPECS = {
    "min above max": ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must not exceed"),
    "tensor 3": ({"parallelism": {"tensor": 3}}, "power of two"),
    "ftp uri": ({"model": {"uri": "ftp://host/model"}}, "hf://, pvc://, s3:// or file://"),
    "replicas above max": ({"replicas": 9, "autoscaling": {"maxReplicas": 4}}, "spec.replicas must lie within"),
    "replicas below min": ({"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}},
                           "spec.replicas must lie within"),
    "gpus other than shards": ({"resources": {"gpus": 2}}, "resources.gpus must be 0 (run on CPU) or equal"),
    "negative gpus": ({"resources": {"gpus": -1}}, "greater than or equal to 0"),
    "gpu product on cpu": ({"resources": {"gpus": 0, "gpuProduct": "NVIDIA-L4"}}, "resources.gpuProduct needs GPUs"),
    "gpu memory on cpu": ({"resources": {"gpus": 0}, "runtime": {"gpuMemoryUtilization": 0.5}},
                          "runtime.gpuMemoryUtilization applies to GPUs"),
    "two model caches": ({"model": {"uri": "hf://o/m", "cacheHostPath": "/c", "cacheVolumeClaim": "c"}},
                         "model.cacheHostPath and model.cacheVolumeClaim are exclusive"),
    "node cache of a pvc model": ({"model": {"uri": "pvc://claim/m", "cacheHostPath": "/c"}},
                                  "model.cacheHostPath caches downloads: it applies to hf:// and s3:// models only"),
    "two compile caches": ({"runtime": {"compileCache": {"hostPath": "/c", "volumeClaim": "k"}}},
                           "runtime.compileCache.hostPath and runtime.compileCache.volumeClaim are exclusive"),
    "ngram range upside down": ({"runtime": {"speculative": {"method": "ngram", "ngramMin": 5}}},
                                "runtime.speculative.ngramMin must not exceed runtime.speculative.ngramMax"),
    "draft without its model": ({"runtime": {"speculative": {"method": "draft"}}},
                                "runtime.speculative.draftModelPath is needed with method draft"),
    "draft path with ngram": ({"runtime": {"speculative": {"method": "ngram", "draftModelPath": "/models/d"}}},
                              "runtime.speculative.draftModelPath is needed with method draft"),
    "draft with tensor parallelism": ({"parallelism": {"tensor": 2}, "runtime": {"speculative": {
        "method": "draft", "draftModelPath": "/models/d"}}}, "method draft runs with parallelism.tensor 1 only"),
    "a flag the operator sets": ({"runtime": {"extraArgs": ["--max-num-seqs", "8", "--port", "9000"]}},
                                 "runtime.extraArgs must not set --model, --served-model-name, --host, --port"),
    "a flag the operator sets, with =": ({"runtime": {"extraArgs": ["--device=cuda"]}},
                                         "runtime.extraArgs must not set"),
    "a variable the operator sets": ({"runtime": {"env": [{"name": "KUBEINFER_DEVICE", "value": "cuda"}]}},
                                     "runtime.env must not set KUBEINFER_MODEL"),
    "tenants and apiKeySecretRef": ({"tenants": {"secretRef": {"name": "t"}}, "apiKeySecretRef": {"name": "k"}},
                                    "tenants.secretRef and apiKeySecretRef both name the API keys' Secret"),
    "tenants with another policy": ({"tenants": {"secretRef": {"name": "t"}},
                                     "runtime": {"schedulingPolicy": "shortest-first"}},
                                    "the replicas' waiting queue follows tenants.schedulingPolicy"),
    "tenants fcfs, runtime fair": ({"tenants": {"secretRef": {"name": "t"}, "schedulingPolicy": "fcfs"},
                                    "runtime": {"schedulingPolicy": "fair"}}, "leave runtime.schedulingPolicy unset"),
    "a tenant cap without a router": ({"tenants": {"secretRef": {"name": "t"}, "maxInFlightPerTenant": 4}},
                                      "tenants.maxInFlightPerTenant is enforced by the router"),
    "a tenant cap, router off": ({"tenants": {"secretRef": {"name": "t"}, "maxInFlightPerTenant": 4},
                                  "router": {"enabled": False}}, "enforced by the router"),
    "two tenant caps": ({"tenants": {"secretRef": {"name": "t"}, "maxInFlightPerTenant": 4},
                         "router": {"maxInFlightPerTenant": 8}}, "set maxInFlightPerTenant once"),
    "tenants without a secret": ({"tenants": {"schedulingPolicy": "fair"}}, "tenants.secretRef"),
    **{f"disaggregation: {name}": ({"router": {}, **patch, "disaggregation": {"prefill": {}, "decode": {}, **pools}},
                                   message) for name, (patch, pools, message) in {
        "without a router": ({"router": None}, {}, "spec.disaggregation needs spec.router"),
        "router off": ({"router": {"enabled": False}}, {}, "spec.disaggregation needs spec.router"),
        "no decode for the prefill pool": ({}, {"prefill": {"replicas": 2}, "decode": {"replicas": 0}},
                                           "disaggregation.decode.replicas must be above 0"),
        "no decode for the default prefill pool": ({}, {"decode": {"replicas": 0}},
                                                   "disaggregation.decode.replicas must be above 0"),
        "spec.replicas beside it": ({"replicas": 2}, {}, "spec.replicas and spec.autoscaling do not apply"),
        "spec.autoscaling beside it": ({"autoscaling": {"maxReplicas": 2}}, {},
                                       "do not apply with spec.disaggregation"),
        "one pool autoscaled": ({}, {"decode": {"autoscaling": {"maxReplicas": 2}}},
                                "disaggregation.prefill.autoscaling and disaggregation.decode.autoscaling go together"),
        "one pool to zero": ({}, {"prefill": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
                                  "decode": {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}},
                             "are 0 together or not at all"),
        "pool replicas out of bounds": ({}, {"prefill": {"replicas": 3, "autoscaling": {"maxReplicas": 2}},
                                             "decode": {"autoscaling": {"maxReplicas": 2}}},
                                        "disaggregation.prefill.replicas must lie within"),
        "decode replicas out of bounds": ({}, {"prefill": {"autoscaling": {"maxReplicas": 2}},
                                               "decode": {"replicas": 0, "autoscaling": {"minReplicas": 0,
                                                                                         "maxReplicas": 2}}},
                                          "disaggregation.decode.replicas must be above 0"),
        "tensor parallel": ({"parallelism": {"tensor": 2}}, {},
                            "runs with parallelism.tensor 1 and parallelism.expert 1"),
        "LoRA": ({"runtime": {"lora": {}}}, {}, "spec.disaggregation does not serve LoRA yet"),
        "two GPUs in a pool": ({}, {"decode": {"resources": {"gpus": 2}}}, "must be 0 (run on CPU) or 1"),
        "KV port on the HTTP port": ({}, {"kvPort": 8000}, "disaggregation.kvPort must not be 8000"),
    }.items()},
    **{f"model pool: {name}": ({"router": {}, **patch, "modelPool": {"models": [{"servedName": "b",
                                                                                "uri": "file:///m/b"}], **pool}},
                               message) for name, (patch, pool, message) in {
        "without a router": ({"router": None}, {}, "spec.modelPool needs spec.router"),
        "router off": ({"router": {"enabled": False}}, {}, "spec.modelPool needs spec.router"),
        "with autoscaling": ({"autoscaling": {"maxReplicas": 2}}, {}, "does not go with spec.disaggregation, "
                                                                      "spec.autoscaling or runtime.lora yet"),
        "with LoRA": ({"runtime": {"lora": {}}}, {}, "does not go with spec.disaggregation"),
        "tensor parallel": ({"parallelism": {"tensor": 2}}, {}, "spec.modelPool runs with parallelism.tensor 1"),
        "a name twice": ({}, {"models": [{"servedName": "b", "uri": "file:///m/b"},
                                         {"servedName": "b", "uri": "file:///m/c"}]}, "servedName must be unique"),
        "the first model's name": ({"model": {"uri": "hf://org/model", "servedName": "b"}}, {},
                                   "must differ from model.servedName"),
        "a download": ({}, {"models": [{"servedName": "b", "uri": "hf://org/b"}]},
                       "modelPool.models[].uri must start with file:// or pvc://"),
        "level 3": ({}, {"sleepLevel": 3}, "Input should be 1 or 2"),
    }.items()},
}


@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_models_refuse_what_cel_refuses(name: str) -> None:
    patch, message = BAD_SPECS[name]
    raw = {"model": {"uri": "hf://org/model"}, **patch}
    with pytest.raises(ValidationError, match=re.escape(message)):
        spec.parse_spec(raw)


@pytest.mark.parametrize("resources, parallelism, gpus", [
    ({}, {}, 1), ({}, {"tensor": 4}, 4), ({"gpus": 4}, {"tensor": 4}, 4), ({"gpus": 0}, {"tensor": 2}, 0)])
def test_gpu_count_is_the_shards_or_zero(resources: dict, parallelism: dict, gpus: int) -> None:
    parsed = spec.parse_spec({"model": {"uri": "hf://org/model"}, "resources": resources, "parallelism": parallelism})
    assert parsed.num_gpus == gpus and parsed.on_cpu == (gpus == 0)


def test_replicas_inside_bounds_beside_autoscaling_is_accepted() -> None:
    parsed = spec.parse_spec({"model": {"uri": "hf://org/model"}, "replicas": 3,
                              "autoscaling": {"minReplicas": 1, "maxReplicas": 4}})
    assert parsed.desired_replicas == 3


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        spec.parse_spec({"model": {"uri": "hf://org/model"}, "gpus": 2})


def test_wire_names_are_camel_case() -> None:
    props = _schema()["properties"]["spec"]["properties"]
    assert {"model", "runtime", "parallelism", "resources", "replicas", "autoscaling", "router", "inferencePool",
            "scheduling", "rollout", "apiKeySecretRef", "tenants", "adapters", "disaggregation",
            "observability", "modelPool"} == set(props)
    assert {"models", "maxAwake", "sleepLevel"} == set(props["modelPool"]["properties"])
    assert "queueTimeoutSeconds" in props["router"]["properties"]
    assert "maxNumBatchedTokens" in props["runtime"]["properties"]
    assert props["rollout"]["properties"]["maxSurge"]["x-kubernetes-int-or-string"] is True


@pytest.mark.parametrize("patch", [
    {"tenants": {"secretRef": {"name": "t"}}},
    {"tenants": {"secretRef": {"name": "t"}}, "runtime": {"schedulingPolicy": "fcfs"}},   # the schema's default
    {"tenants": {"secretRef": {"name": "t"}}, "runtime": {"schedulingPolicy": "fair"}},
    {"tenants": {"secretRef": {"name": "t"}, "schedulingPolicy": "fcfs", "maxInFlightPerTenant": 2}, "router": {}},
    {"apiKeySecretRef": {"name": "k"}, "router": {"maxInFlightPerTenant": 2}},
])
def test_tenants_specs_that_are_accepted(patch: dict[str, Any]) -> None:
    raw = {"model": {"uri": "hf://org/model"}, **patch}
    jsonschema.Draft4Validator(_schema()).validate({"apiVersion": spec.API_VERSION, "kind": spec.KIND, "spec": raw})
    spec.parse_spec(raw)


@pytest.mark.parametrize("name", sorted(n for n in BAD_SPECS if n.startswith("disaggregation: ")))
def test_each_disaggregation_refusal_is_also_a_cel_rule(name: str) -> None:
    """The pydantic check and the API server's CEL rule say the same words (the rules themselves run on a real API
    server in tests/e2e/test_kubectl.py)."""
    _, message = BAD_SPECS[name]
    assert any(message in r["message"] for r in _rules(_schema())), message


@pytest.mark.parametrize("name", sorted(n for n in BAD_SPECS if n.startswith("model pool: ") and "level" not in n))
def test_each_model_pool_refusal_is_also_a_cel_rule(name: str) -> None:
    _, message = BAD_SPECS[name]
    assert any(message in r["message"] for r in _rules(_schema())), message


def test_a_model_pool_that_is_accepted() -> None:
    raw = {"model": {"uri": "pvc://models/a"}, "router": {}, "modelPool": {
        "models": [{"servedName": "b", "uri": "pvc://models/b"}, {"servedName": "c", "uri": "file:///opt/c"}],
        "maxAwake": 2, "sleepLevel": 2}}
    jsonschema.Draft4Validator(_schema()).validate({"apiVersion": spec.API_VERSION, "kind": spec.KIND, "spec": raw})
    parsed = spec.parse_spec(raw)
    assert parsed.model_pool is not None and parsed.model_pool.max_awake == 2


@pytest.mark.parametrize("disaggregation", [
    {"prefill": {}, "decode": {}},
    {"prefill": {"replicas": 0}, "decode": {"replicas": 0}},   # scaled to zero by hand
    {"prefill": {"replicas": 0}, "decode": {"replicas": 2}},   # decode alone: served colocated
    {"kvPort": 9200, "prefill": {"resources": {"gpus": 1}}, "decode": {"resources": {"gpus": 0, "memory": "8Gi"}}},
    {"prefill": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
     "decode": {"replicas": 1, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}},
])
def test_disaggregation_specs_that_are_accepted(disaggregation: dict[str, Any]) -> None:
    raw = {"model": {"uri": "hf://org/model"}, "router": {}, "disaggregation": disaggregation}
    jsonschema.Draft4Validator(_schema()).validate({"apiVersion": spec.API_VERSION, "kind": spec.KIND, "spec": raw})
    parsed = spec.parse_spec(raw)
    assert parsed.disaggregation is not None and parsed.disaggregation.kv_port == disaggregation.get("kvPort", 9100)
