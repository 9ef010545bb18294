"""Where and how replicas run: `spec.parallelism` (GPUs per replica, one runtime process each), `spec.resources`,
`spec.scheduling` and `spec.rollout`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kubeinfer.operator.spec.schema import INT_OR_STRING, PRESERVE, SpecModel, cel, checked_by

TENSOR_PARALLEL_SIZES = [1, 2, 4, 8, 16, 32, 64]

EXPERT_OVER_TENSOR = cel(
    "!has(self.expert) || !has(self.tensor) || self.tensor == 1 || self.expert == 1 || self.expert == self.tensor",
    "parallelism.expert must be 1, equal parallelism.tensor (experts split over the tensor-parallel GPUs), or "
    "go with parallelism.tensor 1 (attention replicated on every GPU, experts split over them)",
)


class Parallelism(SpecModel):
    model_config = checked_by(EXPERT_OVER_TENSOR)

    expert: int = Field(
        default=1, ge=1, le=64,
        description="Mixture-of-experts models: split whole experts over this many of the replica's GPUs (expert "
        "parallelism). Equal to parallelism.tensor, attention stays tensor-parallel over the same GPUs; with "
        "parallelism.tensor 1, every GPU holds the whole attention and 1/expert of the experts. 1 splits each "
        "expert's width over the tensor-parallel GPUs instead. The runtime checks that it divides the model's "
        "experts (a Ready=False condition says so).",
    )
    tensor: int = Field(
        default=1, description="GPUs per replica, one shard each (tensor parallel size).",
        json_schema_extra={"x-kubernetes-validations": [cel(
            "self in " + str(TENSOR_PARALLEL_SIZES),
            "parallelism.tensor must be a power of two between 1 and 64",
        )]},
    )

    @field_validator("tensor")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value not in TENSOR_PARALLEL_SIZES:
            raise ValueError("parallelism.tensor must be a power of two between 1 and 64")
        return value

    @model_validator(mode="after")
    def _expert_over_tensor(self) -> "Parallelism":
        if self.tensor != 1 and self.expert not in (1, self.tensor):
            raise ValueError(EXPERT_OVER_TENSOR["message"])
        return self

    @property
    def processes(self) -> int:
        """Runtime processes (and GPUs) of one replica: one per tensor-parallel shard, or per expert-parallel
        rank when attention is replicated."""
        return max(self.tensor, self.expert)


class Resources(SpecModel):
    gpus: int | None = Field(
        default=None, ge=0, le=64,
        description="GPUs per replica. 0 runs the runtime on CPU: no nvidia.com/gpu is requested and the KV "
        "cache is sized from resources.memory. Default: parallelism.tensor (one GPU per shard).",
    )
    gpu_product: str | None = Field(
        default=None, description="Value of the node label nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3.",
    )
    cpu: int | str | None = Field(default=None, json_schema_extra=INT_OR_STRING)
    memory: int | str | None = Field(default=None, json_schema_extra=INT_OR_STRING)
    shm_size: int | str | None = Field(
        default=None, json_schema_extra=INT_OR_STRING,
        description="sizeLimit of the in-memory /dev/shm volume NCCL uses.",
    )


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Scheduling(SpecModel):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE)
    priority_class_name: str | None = None


class Rollout(SpecModel):
    max_surge: int | str = Field(default=1, json_schema_extra=INT_OR_STRING)
    max_unavailable: int | str = Field(default=0, json_schema_extra=INT_OR_STRING)

