"""Typed InferenceService spec and status: the single source of truth for the CRD.

Field names are camelCase on the wire (aliases); Python code uses snake_case attributes.
Validation that the API server can do is declared here once, twice in form:
``x-kubernetes-validations`` (CEL, read by :mod:`kubeinfer.operator.crd`) and the equivalent
pydantic check, so a spec parsed here is refused for the same reasons the API server refuses it.
Checks that need more than the object itself live in :mod:`kubeinfer.operator.validation`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "kubeinfer.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["infsvc"]
API_VERSION = f"{GROUP}/{VERSION}"

MODEL_URI_RE = r"^(hf|pvc|s3|file)://.+"
TENSOR_PARALLEL_SIZES = [1, 2, 4, 8, 16, 32, 64]
# `kubeinfer serve` flags the operator sets from the spec (operator.pod), and their environment variables.
MANAGED_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size",
                 "--expert-parallel-size", "--enable-expert-parallel", "--api-keys-file", "--device")
MANAGED_ENV = tuple("KUBEINFER_" + flag.lstrip("-").replace("-", "_").upper() for flag in MANAGED_FLAGS)

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
INT_OR_STRING = {"x-kubernetes-int-or-string": True}


def cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    """One CEL rule, as it appears in ``x-kubernetes-validations``."""
    return {"rule": rule, "message": message, **extra}


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def checked_by(*rules: dict[str, Any]) -> ConfigDict:
    """A `_Model` config whose object carries these CEL rules (rules across its fields)."""
    return ConfigDict(**_Model.model_config, json_schema_extra={"x-kubernetes-validations": list(rules)})


MODEL_CACHES_EXCLUSIVE = cel(
    "!has(self.cacheHostPath) || !has(self.cacheVolumeClaim)",
    "model.cacheHostPath and model.cacheVolumeClaim are exclusive: one cache per model",
)
HOST_CACHE_NEEDS_DOWNLOAD = cel(
    "!has(self.cacheHostPath) || self.uri.startsWith('hf://') || self.uri.startsWith('s3://')",
    "model.cacheHostPath caches downloads: it applies to hf:// and s3:// models only",
)


class ModelSource(_Model):
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

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def location(self) -> str:
        """The URI without its scheme (``org/name@rev``, ``claim/path``, ``bucket/prefix``, ``/path``)."""
        return self.uri.split("://", 1)[1]


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _words(items: tuple[str, ...]) -> str:
    return ", ".join(items[:-1]) + " or " + items[-1]


EXTRA_ARGS_UNMANAGED = cel(
    f"self.all(a, !{_cel_list(MANAGED_FLAGS)}.exists(f, a == f || a.startsWith(f + '=')))",
    f"runtime.extraArgs must not set {_words(MANAGED_FLAGS)}: the operator sets them from model, parallelism, "
    "resources.gpus and apiKeySecretRef; any other `kubeinfer serve` flag is allowed",
)
ENV_UNMANAGED = cel(
    f"self.all(e, !(e.name in {_cel_list(MANAGED_ENV)}))",
    f"runtime.env must not set {_words(MANAGED_ENV)}: they are the flags the operator sets from the spec; "
    "any other variable is allowed",
)


class EnvVar(_Model):
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


class Speculative(_Model):
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


class CompileCache(_Model):
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

    @model_validator(mode="after")
    def _one_volume(self) -> CompileCache:
        if self.host_path is not None and self.volume_claim is not None:
            raise ValueError("runtime.compileCache.hostPath and runtime.compileCache.volumeClaim are exclusive")
        return self


class RuntimeSpec(_Model):
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
    speculative: Speculative | None = Field(default=None, description="Off when unset.")
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


EXPERT_OVER_TENSOR = cel(
    "!has(self.expert) || !has(self.tensor) || self.tensor == 1 || self.expert == 1 || self.expert == self.tensor",
    "parallelism.expert must be 1, equal parallelism.tensor (experts split over the tensor-parallel GPUs), or "
    "go with parallelism.tensor 1 (attention replicated on every GPU, experts split over them)",
)


class Parallelism(_Model):
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


class Resources(_Model):
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


class Autoscaling(_Model):
    """Read by the autoscaler policy; names fixed by docs/contracts.md."""

    model_config = checked_by(cel(
        "(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas",
        "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
    ))

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)
    target_queue_depth_per_replica: float = Field(default=4, gt=0)
    target_ttft_p95_seconds: float = Field(default=0.5, gt=0, alias="targetTTFTP95Seconds")
    metric_window_seconds: int = Field(default=60, ge=1)
    scale_up_stabilization_seconds: int = Field(default=0, ge=0)
    scale_down_stabilization_seconds: int = Field(default=300, ge=0)
    max_scale_up_step: int = Field(default=4, ge=1)
    max_scale_down_step: int = Field(default=1, ge=1)
    scale_to_zero_idle_seconds: int = Field(default=600, ge=0)
    router_metrics_url: str | None = Field(
        default=None, pattern=r"^https?://[^\s]+$",
        description="The /metrics of a `kubeinfer router` in front of this service. Requests waiting there for "
                    "a replica (kubeinfer_router_queue_requests) count as queued: with minReplicas 0, one request "
                    "at the router starts a replica.")
    initial_delay_seconds: int = Field(default=120, ge=0)
    tolerance: float = Field(default=0.1, ge=0)
    throughput_per_replica: float | None = Field(
        default=None, gt=0,
        description="Requests per second one replica serves when saturated (e.g. measured with "
                    "benchmarks/serve.py). Optional: the autoscaler measures it on its own once the fleet "
                    "has been busy for a metric window, and the measurement replaces this value.")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        return self


class RouterSpec(_Model):
    """A `kubeinfer router` Deployment in front of the replicas (docs/router.md); its flags, under their names."""

    enabled: bool = Field(default=True, description="Deploy the router (true when spec.router is given).")
    replicas: int = Field(default=1, ge=1, le=64, description="Router pods (each keeps its own prefix index).")
    policy: Literal["prefix", "least-load", "round-robin"] = "prefix"
    prefix_weight: float = Field(default=1.0, ge=0,
                                 description="Score per share of the prompt's prefix a replica holds.")
    load_weight: float = Field(default=0.5, ge=0, description="Score taken per share of the busiest replica's load.")
    kv_weight: float = Field(default=0.25, ge=0, description="Score taken per share of a replica's KV cache in use.")
    footprint_weight: float = Field(default=0.25, ge=0,
                                    description="Score taken per share of the most prefix text sent to one replica.")
    load_bound_epsilon: float = Field(default=1.0, ge=0,
                                      description="Skip replicas above (1 + this) x the mean requests in flight.")
    max_queued_requests: int = Field(default=1024, ge=1,
                                     description="Requests that may wait for a ready replica before 429.")
    queue_timeout_seconds: float = Field(default=60, gt=0, le=3600,
                                         description="How long a request may wait for a ready replica before 503.")
    image: str | None = Field(default=None, description="Router image; the runtime's image when unset.")
    cpu: int | str = Field(default="250m", json_schema_extra=INT_OR_STRING, description="CPU request of a router pod.")
    memory: int | str = Field(default="512Mi", json_schema_extra=INT_OR_STRING,
                              description="Memory request and limit of a router pod.")


class InferencePoolSpec(_Model):
    """An InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1) selecting the replicas,
    for a gateway and endpoint picker (EPP) the user already runs, e.g. llm-d's."""

    endpoint_picker: str = Field(
        min_length=1, max_length=253,
        description="Name of the endpoint picker's Service, in the same namespace (endpointPickerRef.name).")
    endpoint_picker_port: int = Field(default=9002, ge=1, le=65535, description="Its port (endpointPickerRef.port).")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose", description="What the gateway does when the picker does not answer.")


class Toleration(_Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Scheduling(_Model):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE)
    priority_class_name: str | None = None


class Rollout(_Model):
    max_surge: int | str = Field(default=1, json_schema_extra=INT_OR_STRING)
    max_unavailable: int | str = Field(default=0, json_schema_extra=INT_OR_STRING)


class SecretKeyRef(_Model):
    name: str = Field(max_length=253)
    key: str = Field(default="api-keys", description="Key holding one API key per line.")


_TENSOR = "(has(self.parallelism) && has(self.parallelism.tensor) ? self.parallelism.tensor : 1)"
_EXPERT = "(has(self.parallelism) && has(self.parallelism.expert) ? self.parallelism.expert : 1)"
GPUS_MATCH_SHARDS = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus == 0 || self.resources.gpus == "
    f"({_TENSOR} > {_EXPERT} ? {_TENSOR} : {_EXPERT})",
    "resources.gpus must be 0 (run on CPU) or equal the larger of parallelism.tensor and parallelism.expert "
    "(one GPU per runtime process)",
)
CPU_HAS_NO_GPU_PRODUCT = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus != 0 || "
    "!has(self.resources.gpuProduct)",
    "resources.gpuProduct needs GPUs: remove it, or set resources.gpus above 0",
)
CPU_HAS_NO_GPU_MEMORY = cel(
    "!has(self.resources) || !has(self.resources.gpus) || self.resources.gpus != 0 || !has(self.runtime) || "
    "!has(self.runtime.gpuMemoryUtilization)",
    "runtime.gpuMemoryUtilization applies to GPUs; with resources.gpus 0 the KV cache is sized from "
    "resources.memory or runtime.kvCacheMemoryGib",
)
DRAFT_WITHOUT_TENSOR_PARALLELISM = cel(
    "!has(self.runtime) || !has(self.runtime.speculative) || self.runtime.speculative.method != 'draft' || "
    "!has(self.parallelism) || !has(self.parallelism.tensor) || self.parallelism.tensor == 1",
    "runtime.speculative method draft runs with parallelism.tensor 1 only; use method ngram with tensor "
    "parallelism",
)
# `self.replicas < 0`: a negative count is refused once, by the scale subresource's own check.
REPLICAS_IN_BOUNDS = cel(
    "!has(self.autoscaling) || !has(self.replicas) || self.replicas < 0 || "
    "(self.replicas >= (has(self.autoscaling.minReplicas) ? self.autoscaling.minReplicas : 1) "
    "&& self.replicas <= self.autoscaling.maxReplicas)",
    "spec.replicas must lie within [autoscaling.minReplicas, autoscaling.maxReplicas]; "
    "the autoscaler owns spec.replicas when autoscaling is set",
)


class InferenceServiceSpec(_Model):
    model_config = checked_by(REPLICAS_IN_BOUNDS, GPUS_MATCH_SHARDS, CPU_HAS_NO_GPU_PRODUCT, CPU_HAS_NO_GPU_MEMORY,
                              DRAFT_WITHOUT_TENSOR_PARALLELISM)

    model: ModelSource
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    # Defaulted by the API server too, so that `kubectl get -o wide` shows TP 1 when it is not set.
    parallelism: Parallelism = Field(default_factory=Parallelism, json_schema_extra={"default": {}})
    resources: Resources = Field(default_factory=Resources)
    replicas: int | None = Field(
        default=None, ge=0,
        description="Desired replicas, a non-negative integer (1 when unset). With autoscaling it is the starting "
                    "size and the autoscaler owns it.",
    )
    autoscaling: Autoscaling | None = None
    router: RouterSpec | None = Field(
        default=None, description="A cache-aware router in front of the replicas, which also holds requests while "
                                  "none is up (scale from zero); clients call the Service NAME-router.")
    inference_pool: InferencePoolSpec | None = Field(
        default=None, description="Also make an InferencePool NAME of the replicas for a Gateway API Inference "
                                  "Extension gateway (when its CRD is served).")
    scheduling: Scheduling = Field(default_factory=Scheduling)
    rollout: Rollout = Field(default_factory=Rollout)
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret with the API keys; mounted as a file for --api-keys-file.",
    )

    @model_validator(mode="after")
    def _replicas_in_bounds(self) -> InferenceServiceSpec:
        a, r = self.autoscaling, self.replicas
        if a is not None and r is not None and not a.min_replicas <= r <= a.max_replicas:
            raise ValueError(REPLICAS_IN_BOUNDS["message"])
        return self

    @model_validator(mode="after")
    def _accelerators(self) -> InferenceServiceSpec:
        gpus = self.resources.gpus
        if gpus is not None and gpus not in (0, self.parallelism.processes):
            raise ValueError(GPUS_MATCH_SHARDS["message"])
        if gpus == 0 and self.resources.gpu_product is not None:
            raise ValueError(CPU_HAS_NO_GPU_PRODUCT["message"])
        if gpus == 0 and self.runtime.gpu_memory_utilization is not None:
            raise ValueError(CPU_HAS_NO_GPU_MEMORY["message"])
        speculative = self.runtime.speculative
        if speculative is not None and speculative.method == "draft" and self.parallelism.tensor != 1:
            raise ValueError(DRAFT_WITHOUT_TENSOR_PARALLELISM["message"])
        return self

    @property
    def num_gpus(self) -> int:
        """GPUs per replica: resources.gpus, else one per runtime process."""
        return self.parallelism.processes if self.resources.gpus is None else self.resources.gpus

    @property
    def on_cpu(self) -> bool:
        return self.num_gpus == 0

    @property
    def router_enabled(self) -> bool:
        return self.router is not None and self.router.enabled

    @property
    def desired_replicas(self) -> int:
        # Policy: spec.replicas wins; with autoscaling and no replicas, start at
        # minReplicas but never cold (at least one) unless the ceiling says otherwise.
        if self.replicas is not None:
            return self.replicas
        if self.autoscaling is not None:
            return min(max(self.autoscaling.min_replicas, 1), self.autoscaling.max_replicas)
        return 1


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ColdStartObservation(_Model):
    """One pod's creation -> Ready, as the autoscaler observed it (operator.cold_start)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    pod: str
    created_at: str
    ready_at: str
    seconds: float


class InferenceServiceStatus(_Model):
    """Every field a writer puts under status; a real API server prunes undeclared ones."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    observed_generation: int | None = None
    replicas: int | None = Field(default=None, description="Pods of the Deployment (scale subresource).")
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    selector: str | None = Field(default=None, description="Label selector of the pods (scale subresource).")
    endpoint: str | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    queue_depth: float | None = Field(default=None, description="Written by the autoscaler.")
    ttft_p95_seconds: float | None = Field(default=None, alias="ttftP95Seconds", description="Written by the autoscaler.")
    tokens_per_second: float | None = Field(default=None, description="Written by the autoscaler.")
    desired_replicas: int | None = Field(default=None, description="Last autoscaler recommendation.")
    last_scale_time: str | None = Field(default=None, description="When the autoscaler last changed replicas.")
    cold_start_seconds: float | None = Field(
        default=None,
        description="Written by the autoscaler: pod creation -> Ready, median of coldStartSamples; replaces "
        "spec.autoscaling.initialDelaySeconds in the autoscaler's queue projection once measured.")
    cold_start_samples: list[ColdStartObservation] | None = Field(
        default=None, description="Written by the autoscaler: the last pods' creation -> Ready observations.")
    last_signals: dict[str, Any] | None = Field(
        default=None, json_schema_extra=PRESERVE,
        description="Written by the autoscaler: the signals of its last decision (queue, running, TTFT P95, rate).")
    scaling_history: dict[str, Any] | None = Field(
        default=None, json_schema_extra=PRESERVE,
        description="Written by the autoscaler: its windows, last scale events and learned capacity; "
        "a restarted operator resumes from it.")


def parse_spec(raw: dict[str, Any]) -> InferenceServiceSpec:
    """Parse a spec once into the typed model; raises pydantic.ValidationError."""
    return InferenceServiceSpec.model_validate(raw)
