"""Checks the CRD schema cannot express: each bad spec gets a message naming the field and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from kubeinfer.operator.reconcile.validation import semantic_errors
from kubeinfer.operator.spec import parse_spec


def errors(**spec: Any) -> list[str]:
    return semantic_errors(parse_spec({"model": {"uri": "pvc://models/qwen"}, **spec}))


def test_a_good_cpu_spec_has_no_errors() -> None:
    assert errors(resources={"gpus": 0, "cpu": "500m", "memory": "2Gi"}, runtime={"kvCacheMemoryGib": 0.25}) == []


@pytest.mark.parametrize("resources, message", [
    ({"memory": "lots"}, "resources.memory 'lots' is not a Kubernetes quantity"),
    ({"cpu": "0"}, "resources.cpu must be above zero"),
    ({"shmSize": "1Zz"}, "resources.shmSize '1Zz' is not a Kubernetes quantity"),
])
def test_quantities_must_parse_and_be_positive(resources: dict[str, Any], message: str) -> None:
    found = errors(resources=resources)
    assert len(found) == 1 and found[0].startswith(message), found


def test_a_cpu_kv_cache_as_large_as_the_memory_is_refused() -> None:
    found = errors(resources={"gpus": 0, "memory": "4Gi"}, parallelism={"tensor": 2},
                   runtime={"kvCacheMemoryGib": 2})
    assert found == ["runtime.kvCacheMemoryGib 2 per process x 2 leaves no room for the model in "
                     "resources.memory 4Gi on CPU"]
    assert errors(resources={"gpus": 0, "memory": "4Gi"}, parallelism={"tensor": 2},
                  runtime={"kvCacheMemoryGib": 1}) == []
