"""`spec.adapters` and `spec.runtime.lora`: what is refused (by the models, as by the CRD's CEL; and by the checks
that need the whole spec), and the runtime flags LoRA sets."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.install import crd
from kubeinfer.operator.reconcile import builders
from kubeinfer.operator.reconcile.validation import semantic_errors
from kubeinfer.operator.spec import parse_spec

LORA = {"lora": {}}
SQL = {"name": "sql", "uri": "hf://org/sql"}


def raw(model: str = "pvc://models/base", **spec: Any) -> dict[str, Any]:
    return {"model": {"uri": model}, **spec}


@pytest.mark.parametrize("spec, message", [
    (raw(adapters=[SQL]), "spec.adapters needs LoRA on in the replicas: set runtime.lora"),
    (raw(runtime=LORA, adapters=[SQL, {"name": "sql", "uri": "hf://org/other"}]), "adapters[].name must be unique"),
    (raw(runtime=LORA, adapters=[{"name": "SQL", "uri": "hf://o/r"}]), "adapters[].name must be lower-case letters"),
    (raw(runtime=LORA, adapters=[{"name": "org/sql", "uri": "hf://o/r"}]), "adapters[].name must be lower-case"),
    (raw(runtime=LORA, adapters=[{"name": "sql-", "uri": "hf://o/r"}]), "adapters[].name must be lower-case"),
    (raw(runtime=LORA, adapters=[{"name": "sql", "uri": "https://o/r"}]), "adapters[].uri must start with hf://"),
    ({"model": {"uri": "hf://o/base", "servedName": "sql"}, "runtime": LORA, "adapters": [SQL]},
     "adapters[].name must differ from model.servedName"),
    (raw(runtime={"lora": {"maxLoras": 0}}), "greater than or equal to 1"),
    (raw(runtime={"extraArgs": ["--lora-modules", "a=/x"]}), "runtime.extraArgs must not set"),
    (raw(runtime={"extraArgs": ["--max-loras=2"]}), "runtime.extraArgs must not set"),
])
def test_models_refuse_bad_adapter_specs(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        parse_spec(spec)


def test_the_crd_carries_the_same_rules() -> None:
    schema = crd.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = " | ".join(r["message"] for r in schema["x-kubernetes-validations"])
    assert "spec.adapters needs LoRA on" in rules and "must differ from model.servedName" in rules
    adapters = schema["properties"]["adapters"]
    assert adapters["x-kubernetes-validations"][0]["message"] == "adapters[].name must be unique"
    assert "lora" in schema["properties"]["runtime"]["properties"]


@pytest.mark.parametrize("name, spec, message", [
    ("base", raw(runtime=LORA, adapters=[{"name": "base", "uri": "hf://o/r"}]),
     "adapters base: the name is the base model's served name (base)"),
    ("m", raw(runtime=LORA, adapters=[{"name": "x", "uri": "pvc://other/x"}]),
     "adapters x: pvc:// adapters must be on the model's own claim (models), not 'other'"),
    ("m", raw("hf://o/base", runtime=LORA, adapters=[{"name": "x", "uri": "pvc://models/x"}]),
     "adapters x: pvc:// adapters must be on the model's own claim (the model is not on a claim)"),
    ("m", raw(runtime=LORA, adapters=[{"name": "x", "uri": "pvc://models"}]), "names no folder inside the claim"),
    ("m", raw(runtime=LORA, adapters=[{"name": "x", "uri": "s3:///"}]), "names no repository or bucket"),
    ("m", raw(runtime={"lora": {"maxLoras": 2}}, adapters=[{"name": f"a{i}", "uri": f"hf://o/a{i}"} for i in range(9)]),
     "adapters: 9 adapters, more than runtime.lora.maxCpuLoras (8)"),
])
def test_what_needs_the_whole_spec_is_refused_with_the_fix(name: str, spec: dict[str, Any], message: str) -> None:
    errors = semantic_errors(parse_spec(spec), name)
    assert len(errors) == 1 and message in errors[0], errors


def test_a_good_adapter_list_has_no_errors() -> None:
    spec = raw(runtime={"lora": {"maxLoras": 2, "maxCpuLoras": 3}},
               adapters=[SQL, {"name": "chat.v2", "uri": "s3://b/chat"}, {"name": "local_1", "uri": "pvc://models/a"}])
    assert semantic_errors(parse_spec(spec), "base") == []


def args_of(spec: dict[str, Any]) -> list[str]:
    dep = builders.deployment(parse_spec(spec), builders.Owner("m", "ns", "u"), OperatorConfig())
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_lora_sets_the_runtime_flags_with_the_documented_defaults() -> None:
    args = args_of(raw(runtime=LORA))
    assert (flag(args, "--max-loras"), flag(args, "--max-lora-rank"), flag(args, "--max-cpu-loras")) == ("4", "16", None)
    args = args_of(raw(runtime={"lora": {"maxLoras": 8, "maxLoraRank": 64, "maxCpuLoras": 32}}))
    assert (flag(args, "--max-loras"), flag(args, "--max-lora-rank"), flag(args, "--max-cpu-loras")) == ("8", "64", "32")
    assert "--max-loras" not in args_of(raw())
    assert "--lora-modules" not in args_of(raw(runtime=LORA, adapters=[SQL]))   # from the fetcher, at start
