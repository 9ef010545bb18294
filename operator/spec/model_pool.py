"""`spec.modelPool`: more models in every replica, at most `maxAwake` of them awake at a time (docs/router.md,
"Model pool"). The InferenceService's own model is the pool's first; the router wakes the one each request names.

Why a field of the InferenceService rather than InferenceServices that join a pool: a pool's pods, Service and
router are one unit (one memory budget, one router that knows what is awake where), which is what one
InferenceService already owns; models in separate objects would need a reconcile across objects and an owner for the
shared pods.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from kubeinfer.operator.spec.model import SourceUri
from kubeinfer.operator.spec.schema import SpecModel, cel

MAX_MODELS = 31   # the first model's port and 31 more: ports 8000-8031
MEMBER_URI_RE = r"^(file|pvc)://.+"
URI_MESSAGE = "modelPool.models[].uri must start with file:// or pvc://"


class PoolMember(SpecModel, SourceUri):
    served_name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
                             description="The name clients send in requests for this model.")
    uri: str = Field(
        max_length=1024,
        description="Where its weights are: file:///path inside the runtime image, or pvc://claim/path on the claim "
                    "of spec.model's pvc:// URI (the pool's models are not downloaded: one volume per pod).",
        json_schema_extra={"x-kubernetes-validations": [cel(f"self.matches('{MEMBER_URI_RE}')", URI_MESSAGE)]})

    @field_validator("uri")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not re.match(MEMBER_URI_RE, value):
            raise ValueError(URI_MESSAGE)
        return value


NAMES_UNIQUE = cel("self.all(a, self.exists_one(b, b.servedName == a.servedName))",
                   "modelPool.models[].servedName must be unique")


class ModelPool(SpecModel):
    models: list[PoolMember] = Field(
        min_length=1, max_length=MAX_MODELS,
        description="The models besides spec.model that every replica serves (model i+1 on port 8000+i+1).",
        json_schema_extra={"x-kubernetes-validations": [NAMES_UNIQUE]})
    max_awake: int = Field(default=1, ge=1, le=MAX_MODELS + 1,
                           description="Models awake at once per replica; the others sleep, and the router puts the "
                                       "least recently used to sleep before it wakes another.")
    sleep_level: Literal[1, 2] = Field(
        default=1, description="1: a sleeping model's weights wait in host memory (fast wake); 2: they are dropped "
                               "and read again from the model's files (no host memory held).")


# Rules across the whole spec (operator.spec.service lists them).
_ON = "!has(self.modelPool) || "
NEEDS_ROUTER = cel(
    _ON + "(has(self.router) && (!has(self.router.enabled) || self.router.enabled))",
    "spec.modelPool needs spec.router: the router wakes the model each request names")
ALONE = cel(
    _ON + "(!has(self.disaggregation) && !has(self.autoscaling) && (!has(self.runtime) || !has(self.runtime.lora)))",
    "spec.modelPool does not go with spec.disaggregation, spec.autoscaling or runtime.lora yet")
ONE_PROCESS = cel(
    _ON + "!has(self.parallelism) || ((!has(self.parallelism.tensor) || self.parallelism.tensor == 1) && "
    "(!has(self.parallelism.expert) || self.parallelism.expert == 1))",
    "spec.modelPool runs with parallelism.tensor 1 and parallelism.expert 1 (one process per model)")
NOT_THE_FIRST_NAME = cel(
    _ON + "!has(self.model.servedName) || self.modelPool.models.all(m, m.servedName != self.model.servedName)",
    "modelPool.models[].servedName must differ from model.servedName")
RULES = (NEEDS_ROUTER, ALONE, ONE_PROCESS, NOT_THE_FIRST_NAME)


def model_pool_errors(spec: Any) -> list[str]:
    """The messages of the rules across the spec (RULES) that `spec` (an InferenceServiceSpec) breaks."""
    pool = spec.model_pool
    if pool is None:
        return []
    errors = []
    if not spec.router_enabled:
        errors.append(NEEDS_ROUTER["message"])
    if spec.disaggregation is not None or spec.autoscaling is not None or spec.runtime.lora is not None:
        errors.append(ALONE["message"])
    if spec.parallelism.tensor != 1 or spec.parallelism.expert != 1:
        errors.append(ONE_PROCESS["message"])
    names = [m.served_name for m in pool.models]
    if len(set(names)) != len(names):
        errors.append(NAMES_UNIQUE["message"])
    if spec.model.served_name is not None and spec.model.served_name in names:
        errors.append(NOT_THE_FIRST_NAME["message"])
    return errors


def member_errors(spec: Any, service: str) -> list[str]:
    """What the API server cannot check: a member named like the first model when that one takes the InferenceService's
    name (`service`), and the claim of a pvc:// model (a replica mounts one model volume: spec.model's)."""
    pool = spec.model_pool
    if pool is None:
        return []
    errors = [f"modelPool.models[].servedName {service!r} is the first model's name (the InferenceService's)"
              for m in pool.models if m.served_name == service and spec.model.served_name is None]
    claim = spec.model.location.split("/", 1)[0] if spec.model.scheme == "pvc" else None
    for member in pool.models:
        if member.scheme == "pvc" and member.location.split("/", 1)[0] != claim:
            errors.append(f"modelPool.models[] {member.served_name!r}: a pvc:// model must be on the claim of "
                          "spec.model's pvc:// URI" + (f" ({claim})" if claim else "") + ": a replica mounts one "
                          "model volume")
    return errors
