"""The engine's settings: one dataclass, validated once, handed down unchanged.

No torch here: the API process builds and validates the config and never imports torch. What needs the
device (is CUDA there, how many GPUs) is checked by `resolve_device()`, which the model runner calls first
in the engine's own process; its errors reach the user in one line all the same.
"""
import dataclasses
import ipaddress
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.kernels.backend import BACKENDS
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.models.config import DTYPE_BYTES, ModelConfig, torch_dtype

LOAD_FORMATS = ("auto", "dummy")
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e4m3")
SPECULATIVE_METHODS = ("ngram", "draft")
SCHEDULING_POLICIES = ("fcfs", "shortest-first", "fair")   # the waiting queue's order (runtime/engine/scheduler.py)
TOOL_CALL_PARSERS = ("hermes", "llama3_json")
JSON_LAYOUTS = ("model", "compact")
PREFIX_CACHE_SHARING = ("tenant", "shared")
KV_ROLES = ("prefill", "decode")
KV_SOURCE_NETWORKS = ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7")


@dataclass
class EngineConfig:
    model: str
    served_model_name: str | None = None
    dtype: str = "auto"                    # auto = the checkpoint's dtype
    max_model_len: int | None = None       # None = the model's max_position_embeddings
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048     # token budget of one step; prompts longer than this are chunked
    enable_prefix_caching: bool = True
    num_kvcache_blocks: int | None = None  # overrides the memory budget below
    kv_cache_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    cpu_memory_utilization: float | None = None   # CPU: share of host memory; None: 0.9 of a cgroup's, 0.5 of a machine's
    kv_prefault: bool = False              # CPU: the KV pool's pages committed at start-up, not as blocks fill
    max_waiting_requests: int = 1024
    scheduling_policy: str = "fcfs"        # or shortest-first (docs/runtime.md, Scheduling)
    priority_preemption: bool = True       # fair: a waiting higher class preempts running lower ones
    tool_call_parser: str = "hermes"       # how `tool_choice: auto` output is read for calls (docs/server.md)
    json_layout: str = "model"             # structured output's whitespace: the model's own, bounded, or compact
    structured_loop_guard: bool = True     # the loop guards (structured/: loop_guard, string_loops, duplicate_keys)
    prefix_cache_sharing: str = "tenant"   # whose prefix blocks a request reuses: its tenant's/trust group's, or all's
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1          # MoE: experts split over this many of the tensor-parallel ranks
    enable_expert_parallel: bool = False   # = expert_parallel_size tensor_parallel_size
    device: str = "auto"                   # auto = cuda when available, else cpu
    kernel_backend: str = "auto"           # auto | torch | triton | cpu (see kubeinfer.kernels.backend)
    enforce_eager: bool = False            # no CUDA graphs for decode
    cuda_graph_max_batch_size: int = 256   # largest decode batch replayed from a CUDA graph
    load_format: str = "auto"              # auto = the checkpoint's safetensors; dummy = random weights
    weight_cache_dir: str | None = None    # the node's weight cache (models/weight_cache.py); None = off
    kv_cache_dtype: str = "auto"           # auto = the model's (fp16 on the CPU: fp32); a dtype; fp8_e4m3 = 8 bits
    cpu_threads: int | None = None         # torch threads on CPU; None = the CPUs this process may use
    speculative_method: str | None = None  # None = off; ngram = prompt lookup (docs/runtime.md)
    speculative_tokens: int = 4            # tokens proposed per sequence and step, verified in one forward
    speculative_ngram_min: int = 2         # shortest and longest suffix of the context looked up earlier in it
    speculative_ngram_max: int = 4
    speculative_model: str | None = None   # the draft model's folder (speculative_method draft)
    max_loras: int = 0                     # LoRA adapters in one batch (device slots); 0 = LoRA off (docs/lora.md)
    max_lora_rank: int = 16                # the largest adapter rank served
    max_cpu_loras: int | None = None       # adapters kept in host memory; None = max(max_loras, 8)
    lora_modules: dict[str, str] = field(default_factory=dict)   # adapters loaded at start: name -> PEFT folder
    lora_modules_file: str | None = None   # a file of `--lora-modules ...` the server keeps its adapters equal to
    trusted_tenant_header: str | None = None   # a gateway's header naming the tenant (server/trusted_header.py)
    trusted_tenant_networks: tuple[str, ...] = KV_SOURCE_NETWORKS   # where that header is believed from
    # Disaggregated serving (docs/disaggregation.md): a prefill replica serves its prompts' KV on kv_port; a decode
    # replica pulls it for requests that name a KV source. Either role still serves ordinary requests.
    kv_role: str | None = None             # None | prefill | decode
    kv_host: str = "0.0.0.0"               # prefill: the KV endpoint's address
    kv_port: int = 0                       # prefill: its port (0: any free one)
    kv_idle_timeout_s: float = 30.0        # the longest silence from the other side of a transfer
    # decode: the addresses a request's `kubeinfer_kv_source` may name (private networks and loopback by default)
    kv_source_networks: tuple[str, ...] = KV_SOURCE_NETWORKS
    kv_source_key_file: str | None = None  # decode: a key shared with the router; hints must carry its signature
    seed: int = 0
    model_config: ModelConfig = field(init=False, repr=False)
    draft_model_config: ModelConfig | None = field(init=False, repr=False, default=None)

    def __post_init__(self):
        from kubeinfer.runtime.demo import resolve_model_dir
        from kubeinfer.runtime.trained_models import SMOLLM2_NAME
        given = self.model
        self.model = str(resolve_model_dir(given))
        _check_model_dir(self.model)
        self.model_config = ModelConfig.from_dir(self.model)
        # The trained model is served under the name given, not its cache folder's (the demo: demo-model-v1).
        self.served_model_name = self.served_model_name or (given if given == SMOLLM2_NAME else Path(self.model).name)
        limit = self.model_config.max_position_embeddings
        self.max_model_len = self.max_model_len or limit
        _require(self.max_model_len <= limit,
                 f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings {limit}")
        _require(self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
                 f"block_size must be a power of two, got {self.block_size}")
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _require(self.max_num_batched_tokens >= 1,
                 f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        _require(self.dtype == "auto" or self.dtype in DTYPE_BYTES,
                 f"dtype must be auto or one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        _require(self.kernel_backend in BACKENDS,
                 f"kernel_backend must be one of {', '.join(BACKENDS)}, got {self.kernel_backend!r}")
        _require(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                 f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        _require(self.cuda_graph_max_batch_size >= 1,
                 f"cuda_graph_max_batch_size must be >= 1, got {self.cuda_graph_max_batch_size}")
        _require(self.cpu_threads is None or self.cpu_threads >= 1,
                 f"cpu_threads must be >= 1, got {self.cpu_threads}")
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.speculative_method in ("", "none"):
            self.speculative_method = None
        _require(self.speculative_method in (None, *SPECULATIVE_METHODS),
                 f"speculative_method must be one of {', '.join(SPECULATIVE_METHODS)} (or unset), "
                 f"got {self.speculative_method!r}")
        _require(self.speculative_tokens >= 1, f"speculative_tokens must be >= 1, got {self.speculative_tokens}")
        _require(1 <= self.speculative_ngram_min <= self.speculative_ngram_max,
                 f"speculative_ngram_min and speculative_ngram_max must satisfy 1 <= min <= max, got "
                 f"{self.speculative_ngram_min} and {self.speculative_ngram_max}")
        self._validate_draft_model()
        _require(self.load_format in LOAD_FORMATS,
                 f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        _require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization must be in (0, 1]")
        _require(self.cpu_memory_utilization is None or 0 < self.cpu_memory_utilization <= 1,
                 "cpu_memory_utilization must be in (0, 1]")
        _require(self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1")
        _require(self.max_waiting_requests >= 1, "max_waiting_requests must be >= 1")
        _require(self.scheduling_policy in SCHEDULING_POLICIES,
                 f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}")
        _require(self.tool_call_parser in TOOL_CALL_PARSERS,
                 f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}")
        _require(self.json_layout in JSON_LAYOUTS,
                 f"json_layout must be one of {', '.join(JSON_LAYOUTS)}, got {self.json_layout!r}")
        _require(self.prefix_cache_sharing in PREFIX_CACHE_SHARING, "prefix_cache_sharing must be one of "
                 f"{', '.join(PREFIX_CACHE_SHARING)}, got {self.prefix_cache_sharing!r}")
        _require(self.num_kvcache_blocks is None or self.num_kvcache_blocks >= 1,
                 f"num_kvcache_blocks must be >= 1, got {self.num_kvcache_blocks}")
        _require(self.kv_cache_memory_gib is None or self.kv_cache_memory_gib > 0,
                 f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        self._validate_tensor_parallel()
        self._validate_experts()
        self._validate_lora()
        self._validate_kv_role()

    def _validate_kv_role(self) -> None:
        if self.kv_role in ("", "none"):
            self.kv_role = None
        _require(self.kv_role in (None, *KV_ROLES),
                 f"kv_role must be one of {', '.join(KV_ROLES)} (or unset), got {self.kv_role!r}")
        _require(self.kv_role is None or self.world_size == 1,
                 "kv_role needs tensor_parallel_size and expert_parallel_size 1 (each rank would send its shard)")
        _require(0 <= self.kv_port < 65536, f"kv_port must be in [0, 65535], got {self.kv_port}")
        _require(self.kv_idle_timeout_s > 0, f"kv_idle_timeout_s must be > 0, got {self.kv_idle_timeout_s}")
        for network in self.kv_source_networks:
            try:
                ipaddress.ip_network(network)
            except ValueError:
                raise ConfigError(f"kv_source_networks: {network!r} is not a network (CIDR, e.g. 10.0.0.0/8)") from None

    def _validate_lora(self) -> None:
        _require(self.max_loras >= 0, f"max_loras must be >= 0, got {self.max_loras}")
        _require(1 <= self.max_lora_rank <= 512, f"max_lora_rank must be in [1, 512], got {self.max_lora_rank}")
        self.max_cpu_loras = self.max_cpu_loras or max(self.max_loras, 8)
        _require(self.max_cpu_loras >= self.max_loras,
                 f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        _require(not self.lora_modules or self.max_loras > 0, "lora_modules needs max_loras > 0 (LoRA is off)")
        _require(self.max_loras == 0 or self.speculative_method is None,
                 "LoRA adapters and speculative decoding together are not supported yet")

    def _validate_draft_model(self) -> None:
        """The draft model of `speculative_method draft`: there, readable, and speaking the target's vocabulary."""
        self.speculative_model = self.speculative_model or None
        if self.speculative_method != "draft":
            _require(self.speculative_model is None,
                     "speculative_model is only used with speculative_method draft")
            return
        _require(self.speculative_model is not None,
                 "speculative_method draft needs speculative_model, the draft model's folder")
        from kubeinfer.runtime.demo import resolve_model_dir
        self.speculative_model = str(resolve_model_dir(self.speculative_model))
        _check_model_dir(self.speculative_model)
        draft = self.draft_model_config = ModelConfig.from_dir(self.speculative_model)
        _require(draft.vocab_size == self.model_config.vocab_size,
                 f"the draft model's vocabulary has {draft.vocab_size} tokens and the model's "
                 f"{self.model_config.vocab_size}: a draft model must share the model's tokenizer")
        _require(draft.max_position_embeddings >= self.max_model_len,
                 f"the draft model reaches {draft.max_position_embeddings} positions, fewer than max_model_len "
                 f"{self.max_model_len}; lower --max-model-len or pick another draft model")
        _require(self.world_size == 1,
                 "a draft model runs in a single process only, with tensor_parallel_size and "
                 "expert_parallel_size 1 (use speculative_method ngram with tensor or expert parallelism)")

    def resolve_device(self) -> str:
        """The device to run on ("auto" read as cuda or cpu, CUDA checked to exist; the config keeps "auto")."""
        import torch
        device = self.device if self.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            _require(torch.cuda.is_available(), f"device {self.device!r}: no CUDA device is available here "
                     f"(torch {torch.__version__}{'' if torch.version.cuda else ', a CPU-only build'}); "
                     f"use --device cpu or auto")
            index = int(self.device.partition(":")[2] or 0)
            _require(index < torch.cuda.device_count(), f"device {self.device!r}: this machine has "
                     f"{torch.cuda.device_count()} CUDA device(s), numbered from 0")
        n = self.world_size
        if n > 1 and device == "cuda":
            count = torch.cuda.device_count()
            _require(n <= count, f"tensor_parallel_size {self.tensor_parallel_size} with expert_parallel_size "
                     f"{self.expert_parallel_size} needs {n} GPUs; this machine has {count}")
        return device

    def _validate_tensor_parallel(self) -> None:
        n, model = self.tensor_parallel_size, self.model_config
        if n == 1:
            return
        _require(model.num_heads % n == 0, f"tensor_parallel_size {n} does not divide the model's "
                 f"{model.num_heads} attention heads; use a divisor of {model.num_heads}")
        _require(model.num_kv_heads % n == 0 or n % model.num_kv_heads == 0,
                 f"tensor_parallel_size {n} neither divides the model's {model.num_kv_heads} KV heads nor is "
                 f"a multiple of them")
        dense_layers = model.moe is None or not all(model.moe.sparse_layers)
        _require(not dense_layers or model.intermediate_size % n == 0, f"tensor_parallel_size {n} does not divide "
                 f"the model's intermediate size {model.intermediate_size}")
        if self.device.startswith("cuda"):
            _require(self.device == "cuda", f"with tensor_parallel_size {n}, set device to cuda (rank r uses "
                     f"cuda:r), not {self.device!r}")

    def _validate_experts(self) -> None:
        """Expert parallelism splits whole experts over the ranks: the tensor-parallel ones (attention stays
        tensor-parallel), or, with tensor_parallel_size 1, ranks of their own that each compute the whole attention.
        Without it every tensor-parallel rank holds every expert with a share of its width."""
        model, tp = self.model_config, self.tensor_parallel_size
        if self.enable_expert_parallel and self.expert_parallel_size == 1:
            self.expert_parallel_size = tp
        ep = self.expert_parallel_size
        _require(ep >= 1, f"expert_parallel_size must be >= 1, got {ep}")
        if model.moe is None:
            _require(ep == 1, f"expert_parallel_size {ep} needs a mixture-of-experts model; "
                              f"{model.architecture} is dense")
            return
        if ep > 1:
            _require(tp in (1, ep), f"expert_parallel_size {ep} must equal tensor_parallel_size {tp} (experts split "
                     f"over the tensor-parallel ranks) or go with tensor_parallel_size 1 (attention replicated on "
                     f"{ep} ranks, experts split over them)")
            _require(tp > 1 or not self.device.startswith("cuda") or self.device == "cuda",
                     f"with expert_parallel_size {ep}, set device to cuda (rank r uses cuda:r), not {self.device!r}")
            _require(model.moe.num_experts % ep == 0, f"expert_parallel_size {ep} does not divide the model's "
                     f"{model.moe.num_experts} experts; use a divisor of {model.moe.num_experts}")
        elif tp > 1:
            _require(model.moe.intermediate_size % tp == 0, f"tensor_parallel_size {tp} does not divide the "
                     f"experts' intermediate size {model.moe.intermediate_size}; use --enable-expert-parallel")
        shared = model.moe.shared_expert_intermediate_size
        _require(shared % tp == 0, f"tensor_parallel_size {tp} does not divide the shared expert's intermediate "
                                   f"size {shared}")
        self.model_config = dataclasses.replace(
            model, moe=dataclasses.replace(model.moe, expert_parallel_size=ep))

    @property
    def world_size(self) -> int:
        """Processes of the engine: one per tensor-parallel rank, or per expert-parallel rank when attention is
        replicated."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def torch_dtype(self):
        return torch_dtype(self.model_config.dtype_name if self.dtype == "auto" else self.dtype)

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)


def _check_model_dir(path: str) -> None:
    """A missing, unreadable or non-folder model path, said in one sentence (a bad mount shows up here)."""
    denied = ConfigError(f"model folder {path!r} cannot be read by uid {os.getuid()}: permission denied; check "
                         f"the volume's permissions (a pod's fsGroup)")
    try:
        is_dir = stat.S_ISDIR(Path(path).stat().st_mode)
    except FileNotFoundError:
        raise ConfigError(f"model folder {path!r} does not exist") from None
    except PermissionError:
        raise denied from None
    if not is_dir:
        raise ConfigError(f"model {path!r} is not a folder; expected a Hugging Face model folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise denied


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubeinfer"
