"""`spec.model`: where the weights come from, and where downloads are cached."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from kubeinfer.operator.spec.schema import SpecModel, cel, checked_by

MODEL_URI_RE = r"^(hf|pvc|s3|file)://.+"

MODEL_CACHES_EXCLUSIVE = cel(
    "!has(self.cacheHostPath) || !has(self.cacheVolumeClaim)",
    "model.cacheHostPath and model.cacheVolumeClaim are exclusive: one cache per model",
)
HOST_CACHE_NEEDS_DOWNLOAD = cel(
    "!has(self.cacheHostPath) || self.uri.startsWith('hf://') || self.uri.startsWith('s3://')",
    "model.cacheHostPath caches downloads: it applies to hf:// and s3:// models only",
)


class SourceUri:
    """The parts of a spec object's `uri` field, one of the model sources' schemes (the model, an adapter)."""

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def location(self) -> str:
        """The URI without its scheme (``org/name@rev``, ``claim/path``, ``bucket/prefix``, ``/path``)."""
        return self.uri.split("://", 1)[1]


class ModelSource(SpecModel, SourceUri):
    model_config = checked_by(MODEL_CACHES_EXCLUSIVE, HOST_CACHE_NEEDS_DOWNLOAD)

    uri: str = Field(
        max_length=1024,
        description="Where the weights are: hf://org/name[@revision], pvc://claim/path, "
        "s3://bucket/prefix, or file:///path inside the runtime image.",
        json_schema_extra={"x-kubernetes-validations": [cel(
            f"self.matches('{MODEL_URI_RE}')",
            "model.uri must start with hf://, pvc://, s3:// or file://",
        )]},
    )
    served_name: str | None = Field(
        default=None, max_length=253,
        description="Model name clients send in requests; defaults to the InferenceService name.",
    )
    credentials_secret: str | None = Field(
        default=None, max_length=253,
        description="Secret whose keys become env vars of the download init container "
        "(HF_TOKEN, AWS_ACCESS_KEY_ID, ...).",
    )
    cache_volume_claim: str | None = Field(
        default=None, max_length=253,
        description="PVC that keeps downloaded hf:// / s3:// weights across restarts; "
        "an emptyDir is used when unset.",
    )
    cache_size_limit: str | None = Field(
        default=None, description="sizeLimit of the emptyDir download cache.",
    )
    cache_host_path: str | None = Field(
        default=None, max_length=1024, pattern=r"^/",
        description="Node-local download cache for hf:// / s3:// weights: a directory on each node (hostPath, "
        "created if missing) that every replica on the node shares, so a model is downloaded once per node and "
        "reused by every replica and restart there. It must be writable by uid 1000 (create it owned by 1000).",
    )

    @field_validator("uri")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not re.match(MODEL_URI_RE, value):
            raise ValueError("model.uri must start with hf://, pvc://, s3:// or file://")
        return value

    @model_validator(mode="after")
    def _cache(self) -> ModelSource:
        if self.cache_host_path is not None and self.cache_volume_claim is not None:
            raise ValueError(MODEL_CACHES_EXCLUSIVE["message"])
        if self.cache_host_path is not None and self.scheme not in ("hf", "s3"):
            raise ValueError(HOST_CACHE_NEEDS_DOWNLOAD["message"])
        return self
