"""`spec.runtime`: the `kubeinfer serve` settings of each replica (batching, KV cache, speculative decoding,
compile cache, extra flags and environment)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from kubeinfer.operator.spec.adapters import Lora
from kubeinfer.operator.spec.schema import INT_OR_STRING, PRESERVE, SpecModel, cel, checked_by

# `kubeinfer serve` flags the operator sets from the spec (reconcile.pod), and their environment variables.
MANAGED_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size",
                 "--expert-parallel-size", "--enable-expert-parallel", "--api-keys-file", "--device",
                 "--max-loras", "--max-lora-rank", "--max-cpu-loras", "--lora-modules", "--kv-role", "--kv-host",
                 "--kv-port", "--kv-source-networks", "--kv-source-key-file", "--prefix-cache-sharing",
                 "--trusted-tenant-header", "--sleep-at-start")
MANAGED_ENV = tuple("KUBEINFER_" + flag.lstrip("-").replace("-", "_").upper() for flag in MANAGED_FLAGS)


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _words(items: tuple[str, ...]) -> str:
    return ", ".join(items[:-1]) + " or " + items[-1]


EXTRA_ARGS_UNMANAGED = cel(
    f"self.all(a, !{_cel_list(MANAGED_FLAGS)}.exists(f, a == f || a.startsWith(f + '=')))",
    f"runtime.extraArgs must not set {_words(MANAGED_FLAGS)}: the operator sets them from model, parallelism, "
    "resources.gpus, apiKeySecretRef, tenants, runtime.lora, adapters, disaggregation and modelPool; any other "
    "`kubeinfer serve` flag is allowed",
)
ENV_UNMANAGED = cel(
    f"self.all(e, !(e.name in {_cel_list(MANAGED_ENV)}))",
    f"runtime.env must not set {_words(MANAGED_ENV)}: they are the flags the operator sets from the spec; "
    "any other variable is allowed",
)


class EnvVar(SpecModel):
    name: str = Field(min_length=1, max_length=256)
    value: str | None = None
    value_from: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE)


NGRAM_RANGE = cel(
    "(has(self.ngramMin) ? self.ngramMin : 2) <= (has(self.ngramMax) ? self.ngramMax : 4)",
    "runtime.speculative.ngramMin must not exceed runtime.speculative.ngramMax",
)
DRAFT_NEEDS_MODEL = cel(
    "(self.method == 'draft') == has(self.draftModelPath)",
    "runtime.speculative.draftModelPath is needed with method draft, and only there",
)


class Speculative(SpecModel):
    """Speculative decoding: drafts proposed each step and verified by one forward of the model (docs/runtime.md)."""

    model_config = checked_by(NGRAM_RANGE, DRAFT_NEEDS_MODEL)

    method: Literal["ngram", "draft"] = Field(
        description="ngram: prompt lookup, no extra weights; proposes what followed the latest earlier occurrence "
                    "of the context's last tokens. draft: a small model with the same tokenizer proposes "
                    "(draftModelPath). Either way greedy output is unchanged and sampled output keeps its "
                    "distribution.")
    num_tokens: int = Field(default=4, ge=1, le=16, description="Draft tokens per sequence and step, at most.")
    ngram_min: int = Field(default=2, ge=1, le=16, description="Shortest suffix looked up (ngram).")
    ngram_max: int = Field(default=4, ge=1, le=16, description="Longest suffix looked up (ngram).")
    draft_model_path: str | None = Field(
        default=None, max_length=4096, pattern=r"^/",
        description="The draft model's folder inside the runtime container (method draft): baked into the image, "
                    "or inside the model's volume (pvc://: under /models). Needs parallelism.tensor 1.")

    @model_validator(mode="after")
    def _consistent(self) -> "Speculative":
        if self.ngram_min > self.ngram_max:
            raise ValueError(NGRAM_RANGE["message"])
        if (self.method == "draft") != (self.draft_model_path is not None):
            raise ValueError(DRAFT_NEEDS_MODEL["message"])
        return self


class CompileCache(SpecModel):
    """Where compiled kernels are kept (Triton's cache; torch's and CUDA's too): mounted at
    /var/cache/kubeinfer. An emptyDir by default, which a restarted container keeps; a node directory or a PVC
    keeps them for every pod, so a new replica loads its kernels instead of compiling them (~5 s of a GPU
    start-up, docs/benchmarks.md)."""

    model_config = checked_by(cel(
        "!has(self.hostPath) || !has(self.volumeClaim)",
        "runtime.compileCache.hostPath and runtime.compileCache.volumeClaim are exclusive",
    ))

    host_path: str | None = Field(
        default=None, max_length=1024, pattern=r"^/",
        description="A directory on each node (hostPath, created if missing), shared by every replica on the "
        "node. Writable by uid 1000, or the runtime falls back to a per-pod cache (and logs why).")
    volume_claim: str | None = Field(default=None, max_length=253, description="A PVC (ReadWriteMany to share it).")
    size_limit: int | str | None = Field(
        default=None, json_schema_extra=INT_OR_STRING, description="sizeLimit of the default emptyDir.")
    weights: bool = Field(
        default=False, description="Also keep each model as the engine holds it (converted, sharded, packed) in "
        "this cache, under weights/: a later engine start on the node (a new replica, a restarted container) loads "
        "it from there instead of reading and converting the checkpoint (docs/runtime.md, 'Weight cache'). Needs "
        "room for the model's weights at the serving dtype; nothing evicts them.")

    @model_validator(mode="after")
    def _one_volume(self) -> CompileCache:
        if self.host_path is not None and self.volume_claim is not None:
            raise ValueError("runtime.compileCache.hostPath and runtime.compileCache.volumeClaim are exclusive")
        return self


class RuntimeSpec(SpecModel):
    image: str | None = Field(default=None, description="Runtime image; the operator's default when unset.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    block_size: int = Field(default=16, ge=1, le=256)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_waiting_requests: int | None = Field(default=None, ge=0)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    kv_cache_memory_gib: float | None = Field(default=None, gt=0)
    kv_cache_dtype: Literal["auto", "fp8_e4m3"] = Field(
        default="auto", description="auto: the model's dtype; fp8_e4m3: 8-bit K/V, twice the tokens of a 16-bit "
                                    "cache in the same memory (docs/runtime.md: its precision).")
    scheduling_policy: Literal["fcfs", "shortest-first", "fair"] = Field(
        default="fcfs", description="The waiting queue's order: fcfs (arrival), shortest-first (a burst's short "
                                    "prompts first: a lower median TTFT, a higher P95 under sustained load) or "
                                    "fair (priority classes, then a weighted fair share of tokens between the API "
                                    "keys' tenants); docs/runtime.md.")
    speculative: Speculative | None = Field(default=None, description="Off when unset.")
    lora: Lora | None = Field(default=None, description="LoRA adapters (spec.adapters); off when unset.")
    compile_cache: CompileCache = Field(default_factory=CompileCache)
    drain_timeout_seconds: int = Field(default=30, ge=0, le=3600)
    startup_timeout_seconds: int = Field(
        default=1800, ge=60, le=86400,
        description="How long a replica may take to load the model before it is restarted.",
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=64, description="Extra `kubeinfer serve` flags.",
        json_schema_extra={"x-kubernetes-validations": [EXTRA_ARGS_UNMANAGED]})
    env: list[EnvVar] = Field(default_factory=list, max_length=128,
                              json_schema_extra={"x-kubernetes-validations": [ENV_UNMANAGED]})

    @field_validator("extra_args")
    @classmethod
    def _unmanaged_flags(cls, value: list[str]) -> list[str]:
        if any(arg.split("=", 1)[0] in MANAGED_FLAGS for arg in value):
            raise ValueError(EXTRA_ARGS_UNMANAGED["message"])
        return value

    @field_validator("env")
    @classmethod
    def _unmanaged_env(cls, value: list[EnvVar]) -> list[EnvVar]:
        if any(var.name in MANAGED_ENV for var in value):
            raise ValueError(ENV_UNMANAGED["message"])
        return value

