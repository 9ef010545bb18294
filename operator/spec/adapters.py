"""`spec.adapters` and `spec.runtime.lora`: LoRA adapters served beside the base model (docs/lora.md).

An adapter is a name clients send as `model` and a URI of a PEFT folder; the URI schemes are the model's own
(hf://, s3://, pvc://, file://). `runtime.lora` turns LoRA on and sizes the runtime's slots; a list of adapters
needs it. The rules that need the rest of the spec (a name equal to the served name, the claim of a pvc://
adapter, more adapters than host slots) are checked in :mod:`kubeinfer.operator.reconcile.validation`.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from kubeinfer.operator.spec.model import MODEL_URI_RE, SourceUri
from kubeinfer.operator.spec.schema import SpecModel, cel

# An OpenAI model id that is also safe in a label value, a file name and a shell word: lower-case DNS-ish.
ADAPTER_NAME_RE = r"^[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?$"
MAX_ADAPTERS = 256
DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_LORA_RANK = 16
MIN_CPU_LORAS = 8   # the runtime's --max-cpu-loras default: max(--max-loras, 8)


class Lora(SpecModel):
    """LoRA in each replica (`kubeinfer serve --max-loras/--max-lora-rank/--max-cpu-loras`); on when present."""

    max_loras: int = Field(default=DEFAULT_MAX_LORAS, ge=1, le=64,
                           description="Adapters in one batch (device slots).")
    max_lora_rank: int = Field(default=DEFAULT_MAX_LORA_RANK, ge=1, le=512,
                               description="The largest rank an adapter may have; slots are sized for it.")
    max_cpu_loras: int | None = Field(
        default=None, ge=1, le=MAX_ADAPTERS,
        description="Adapters kept loaded in host memory (the runtime's default: max(maxLoras, 8)); "
                    "spec.adapters may list at most this many.")

    @property
    def cpu_slots(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else max(self.max_loras, MIN_CPU_LORAS)


class Adapter(SpecModel, SourceUri):
    name: str = Field(
        max_length=63, description="The name clients send as `model`; lower-case letters, digits, '-', '.', '_'.",
        json_schema_extra={"x-kubernetes-validations": [cel(
            f"self.matches('{ADAPTER_NAME_RE}')",
            "adapters[].name must be lower-case letters, digits, '-', '.' or '_', starting and ending with a "
            "letter or digit",
        )]},
    )
    uri: str = Field(
        max_length=1024,
        description="A PEFT folder (adapter_config.json + adapter_model.safetensors): hf://org/name[@revision], "
        "s3://bucket/prefix, pvc://claim/path (the model's own claim) or file:///path inside the runtime image.",
        json_schema_extra={"x-kubernetes-validations": [cel(
            f"self.matches('{MODEL_URI_RE}')", "adapters[].uri must start with hf://, pvc://, s3:// or file://",
        )]},
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.match(ADAPTER_NAME_RE, value):
            raise ValueError("adapters[].name must be lower-case letters, digits, '-', '.' or '_', starting and "
                             "ending with a letter or digit")
        return value

    @field_validator("uri")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not re.match(MODEL_URI_RE, value):
            raise ValueError("adapters[].uri must start with hf://, pvc://, s3:// or file://")
        return value


ADAPTER_NAMES_UNIQUE = cel("self.all(a, self.exists_one(b, b.name == a.name))",
                           "adapters[].name must be unique")
ADAPTERS_NEED_LORA = cel(
    "!has(self.adapters) || size(self.adapters) == 0 || (has(self.runtime) && has(self.runtime.lora))",
    "spec.adapters needs LoRA on in the replicas: set runtime.lora (e.g. {maxLoras: 4, maxLoraRank: 16})",
)
ADAPTER_NOT_SERVED_NAME = cel(
    "!has(self.adapters) || !has(self.model.servedName) || self.adapters.all(a, a.name != self.model.servedName)",
    "adapters[].name must differ from model.servedName: clients name the base model by it",
)
