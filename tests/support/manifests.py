"""InferenceService manifests and status conditions as the operator tests build and read them."""
from __future__ import annotations

from typing import Any


def isvc_manifest(name: str, namespace: str, uid: str | None = None, **spec: Any) -> dict[str, Any]:
    """An InferenceService of the model `pvc://models/qwen` as the API server would return it (generation 1,
    resourceVersion 1), with `spec` on top."""
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}", "generation": 1,
                         "resourceVersion": "1"},
            "spec": {"model": {"uri": "pvc://models/qwen"}, **spec}}


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The status condition of `type_` ({} when absent)."""
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})
