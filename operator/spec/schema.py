"""The ground every section of the spec stands on: the API's names, the pydantic base model (camelCase on the
wire, snake_case in Python, unknown fields refused), and the CEL rule helper.

Validation that the API server can do is declared once per rule, twice in form: ``x-kubernetes-validations``
(CEL, read by :mod:`kubeinfer.operator.install.crd`) and the equivalent pydantic check, so a spec parsed here is
refused for the same reasons the API server refuses it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

GROUP = "kubeinfer.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["infsvc"]
API_VERSION = f"{GROUP}/{VERSION}"

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
INT_OR_STRING = {"x-kubernetes-int-or-string": True}


def cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    """One CEL rule, as it appears in ``x-kubernetes-validations``."""
    return {"rule": rule, "message": message, **extra}


class SpecModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def checked_by(*rules: dict[str, Any]) -> ConfigDict:
    """A `SpecModel` config whose object carries these CEL rules (rules across its fields)."""
    return ConfigDict(**SpecModel.model_config, json_schema_extra={"x-kubernetes-validations": list(rules)})
