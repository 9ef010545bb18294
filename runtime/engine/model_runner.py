"""Owns the device: builds the model and its KV pool, turns a scheduled batch into tensors, runs, samples."""
import contextlib
import itertools
import logging
import time

import torch

from kubeinfer.kernels import get_backend, ops, set_backend
from kubeinfer.kernels.backend import use_triton
from kubeinfer.kernels.metadata import FP8_DTYPE, AttentionMetadata
from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.context import ForwardContext, set_context
from kubeinfer.runtime.cpu_allocator import keep_freed_memory
from kubeinfer.runtime.cpu_threads import configure_torch_threads
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.cuda_graphs import DecodeGraphs, capture_engine_graphs
from kubeinfer.runtime.engine import kv_sizing
from kubeinfer.runtime.engine.draft_model import DraftModel
from kubeinfer.runtime.engine.scheduler import ScheduledBatch
from kubeinfer.runtime.engine.step_inputs import StepInputs, build_step_inputs, lora_slot_ids, step_to_device
from kubeinfer.runtime.layers.attention import PagedAttention
from kubeinfer.runtime.layers.fused_moe import FusedMoE
from kubeinfer.runtime.layers.linear import pack_cpu_weights
from kubeinfer.runtime.engine.messages import TokenLogprobs
from kubeinfer.runtime.layers.sampler import Sampler
from kubeinfer.runtime.lora.weights import LoraWeights
from kubeinfer.runtime.engine.sleep import weight_slots
from kubeinfer.runtime.models import weight_cache
from kubeinfer.runtime.models.loader import build_model
from kubeinfer.runtime.engine.tp_worker import WorkerGroup, rank_device
from kubeinfer.runtime.parallel import min_over_ranks, tp_size, world_size

logger = logging.getLogger(__name__)


def kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's dtype: "auto" is the model's, except for an fp16 model on the CPU, whose attention kernel reads
    fp32 and bf16 caches only (an fp16 cache would take the slower reference attention), so it keeps fp32 K/V."""
    if name == "fp8_e4m3":
        return FP8_DTYPE
    if name != "auto":
        return getattr(torch, name)
    return torch.float32 if device.type == "cpu" and model_dtype == torch.float16 else model_dtype


class ModelRunner:
    """Rank 0's runner builds each step's inputs, runs the forward and samples; with tensor parallelism it
    first starts ranks 1..N-1 (see `tp_worker`), each with a runner of its own that only runs `execute`."""

    def __init__(self, config: EngineConfig, rank: int = 0):
        self.device = rank_device(config, rank)   # checked where it is used: the API process has no torch
        self.config = config
        self.rank = rank
        self.workers: WorkerGroup | None = None
        if config.world_size > 1 and rank == 0:
            self.workers = WorkerGroup(config)
        try:
            self._build(config)
        except BaseException:
            self.shutdown()
            raise

    def _build(self, config: EngineConfig) -> None:
        if world_size() != config.world_size:
            raise RuntimeError(f"the engine runs {config.world_size} processes but this one is in a group of "
                               f"{world_size()}: one parallel engine per process, alone")
        if self.device.type == "cpu":
            keep_freed_memory()   # each step's activations reuse the heap, not fresh pages
        if self.device.type == "cpu" and config.world_size == 1:   # TP/EP workers share the CPUs
            threads = configure_torch_threads(config.cpu_threads)
            if threads is not None:
                logger.info("CPU: %d torch threads (--cpu-threads, else the CPUs this process may use)", threads)
        self.dtype = config.torch_dtype
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, self.dtype, self.device)
        set_backend(config.kernel_backend)
        torch.manual_seed(config.seed)   # draws of requests without a seed
        self.startup_phases: dict[str, float] = {}
        with self._phase("weights"):
            self._load_model(config)
        self.draft: DraftModel | None = None
        if config.speculative_method == "draft":
            with self._phase("draft_weights"):
                self.draft = DraftModel(self._build_draft(config), config.draft_model_config, config.block_size,
                                        self.device)
        with self._phase("kv_cache"):
            self._allocate_kv_cache(config)
        self.sampler = Sampler(config.model_config.eos_token_ids, config.structured_loop_guard)
        self.cuda_graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None   # speculative steps: q = speculative_tokens + 1 a sequence
        with self._phase("warmup"):   # on the CPU too: its native kernels build at their first call
            self._warm_up()
        if self.device.type == "cuda" and self._graphs_wanted(config):
            with self._phase("cuda_graphs"):
                self._capture_graphs(config)
        for moe in self.moe_layers:
            moe.routed_tokens.zero_()   # warm-up and capture routed no request's tokens

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Times one start-up phase (device work included) into `startup_phases`."""
        started = time.monotonic()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.startup_phases[name] = time.monotonic() - started

    def _build_target(self, config: EngineConfig) -> torch.nn.Module:   # from the node's weight cache if it has it
        def build(load: bool = True) -> torch.nn.Module:
            model = build_model(config.model_config, config.model, config.max_model_len, self.dtype, self.device,
                                dummy_seed=config.seed if config.load_format == "dummy" else None, load=load)
            if load and self.device.type == "cpu" and get_backend() in ("auto", "cpu"):   # the native CPU path:
                logger.info("CPU: %d linear weights packed", pack_cpu_weights(model))      # GEMMs on packed weights
            return model
        model = weight_cache.load_or_build(config, self.dtype, self.device, self.rank, build)
        self.weight_bytes = sum(slot.nbytes for slot in weight_slots([model]))   # packed copies included
        return model

    def _build_draft(self, config: EngineConfig) -> torch.nn.Module:
        return build_model(config.draft_model_config, config.speculative_model, config.max_model_len, self.dtype,
                           self.device)

    def build_models(self) -> list[torch.nn.Module]:
        """The target model and the draft model if any, built again from their checkpoints (engine/sleep.py)."""
        return [self._build_target(self.config)] + ([self._build_draft(self.config)] if self.draft else [])

    def _load_model(self, config: EngineConfig) -> None:
        model_config = config.model_config
        self.model = self._build_target(config)
        self.moe_layers = [m for m in self.model.modules() if isinstance(m, FusedMoE)]   # empty: a dense model
        self.lora = LoraWeights(self.model, model_config, config.max_loras, config.max_lora_rank, config.max_cpu_loras,
                                self.dtype, self.device) if config.max_loras else None
        logger.info("loaded %s (%s, %s%s); weights %.1f MiB on rank %d of %d", config.model,
                    model_config.architecture, self.dtype, ", dummy weights" if config.load_format == "dummy" else "",
                    self.weight_bytes / 2**20, self.rank, world_size())

    def _allocate_kv_cache(self, config: EngineConfig) -> None:
        model_config = config.model_config
        self.num_kv_heads = max(1, model_config.num_kv_heads // tp_size())
        num_blocks, budget_source = self._num_kv_blocks()
        self.num_blocks = min_over_ranks(num_blocks, self.device)   # one block table fits every rank
        fits = self.num_blocks * config.block_size
        # A sequence longer than the whole cache could never finish: it would preempt itself forever and hold up
        # every request behind it. Every sequence must fit alone, so the engine serves the lower of the two limits
        # (the config keeps the one asked for).
        self.max_model_len = min(config.max_model_len, fits)
        if fits < config.max_model_len:
            logger.warning("the KV cache holds %d tokens (%d blocks of %d), fewer than max_model_len %d: "
                           "max_model_len lowered to %d so that one sequence always fits (give the KV cache "
                           "more memory, or set --max-model-len)", fits, self.num_blocks, config.block_size,
                           config.max_model_len, fits)
        shape = (2, model_config.num_layers, self.num_blocks, config.block_size, self.num_kv_heads, model_config.head_dim)
        started = time.perf_counter()
        self.kv_cache = (kv_sizing.lazy_zeros(shape, self.kv_dtype, config.kv_prefault) if self.device.type == "cpu"
                         else torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
        if self.draft is not None:   # the same blocks, addressed by the same tables
            self.draft.allocate_kv_cache(self.num_blocks, self.kv_dtype)
        attention_layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        for layer, module in enumerate(attention_layers):
            module.k_cache, module.v_cache = self.kv_cache[0, layer], self.kv_cache[1, layer]
        committed = f"; committed in {time.perf_counter() - started:.1f} s" if config.kv_prefault else ""
        logger.info("KV cache: %d blocks of %d tokens (%.2f GiB, %s): %d tokens, %.1f sequences of max_model_len %d%s",
                    self.num_blocks, config.block_size, self.kv_cache.numel() * self.kv_cache.element_size() / 2**30,
                    budget_source, fits, fits / self.max_model_len, self.max_model_len, committed)

    @property
    def max_blocks_per_seq(self) -> int:
        """Block table columns of the longest sequence the engine serves (`max_model_len`, the runner's)."""
        return -(-self.max_model_len // self.config.block_size)

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """One prefill and one decode forward before the first request (of the draft model too), so that the
        kernels compile (Triton's, or the CPU's native ones with gcc) or load from their caches at start-up rather
        than inside someone's time to first token. Slots are -1: nothing is written to the KV cache."""
        models = [self.model] + ([self.draft.model] if self.draft is not None else [])
        for model, num_tokens in itertools.product(models, (min(16, self.max_model_len), 1)):
            meta = AttentionMetadata(
                cu_seqlens_q=torch.tensor([0, num_tokens], dtype=torch.int32, device=self.device),
                seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=self.device),
                block_tables=torch.zeros(1, self.max_blocks_per_seq, dtype=torch.int32, device=self.device),
                max_seqlen_q=num_tokens, max_seqlen_k=num_tokens,
                slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=self.device))
            set_context(ForwardContext(meta))
            try:
                hidden = model(torch.zeros(num_tokens, dtype=torch.int64, device=self.device),
                               torch.arange(num_tokens, device=self.device))
            finally:
                set_context(None)
            model.compute_logits(hidden[-1:])

    def _graphs_wanted(self, config: EngineConfig) -> bool:
        if config.enforce_eager:
            return False
        if not use_triton(self.kv_cache):
            logger.info("CUDA graphs off: they need the Triton kernels (kernel_backend is %s)", config.kernel_backend)
            return False
        if world_size() > 1:
            logger.info("CUDA graphs off: not yet captured with tensor or expert parallelism (runs eagerly)")
            return False
        return True

    def _capture_graphs(self, config: EngineConfig) -> None:
        self.cuda_graphs, self.verify_graphs = capture_engine_graphs(config, self.max_model_len, self.model, self.draft,
                                                                     self.dtype, self.device)

    def _num_kv_blocks(self) -> tuple[int, str]:
        """Blocks this rank's budget holds, and where the budget came from (for the log line)."""
        config, model_config = self.config, self.config.model_config
        block_bytes = (2 * model_config.num_layers * config.block_size * self.num_kv_heads
                       * model_config.head_dim * self.kv_dtype.itemsize)
        if self.draft is not None:   # a block of the draft's pool comes with each block of ours
            block_bytes += self.draft.block_bytes(self.kv_dtype)
        return kv_sizing.num_kv_blocks(config, block_bytes, self.device, self.dtype)

    def expert_load(self) -> list[list[int]] | None:
        """Tokens routed to each expert since start-up, per MoE layer (None for a dense model). Rank 0 routes every
        token (the router is replicated), so its counts are the whole engine's."""
        if not self.moe_layers:
            return None
        return torch.stack([m.routed_tokens for m in self.moe_layers]).tolist()

    def shutdown(self) -> None:
        """Stops the other tensor-parallel ranks, if any. Idempotent."""
        if self.workers is not None:
            self.workers.shutdown()

    def prepare(self, batch: ScheduledBatch, block_manager: BlockManager):
        """Flattened inputs of one step on the device, its attention metadata, and the rows to sample."""
        return self._to_device(self.prepare_host(batch, block_manager))

    def prepare_host(self, batch: ScheduledBatch, block_manager: BlockManager) -> StepInputs:
        """The step's inputs as host tensors."""
        step = build_step_inputs(batch, block_manager, self.config.block_size)
        step.lora_slot_ids = lora_slot_ids(batch, self.config.max_loras) if self.lora is not None else None
        return step

    def _to_device(self, step: StepInputs):
        return step_to_device(step, self.device)

    @torch.inference_mode()
    def execute(self, step: StepInputs) -> torch.Tensor | None:
        """The forward of one step, run by every rank; the logits of the rows to sample (None if none)."""
        graphs = self.cuda_graphs
        if step.lora_loads:
            self.lora.apply(step.lora_loads)
        verify = self.verify_graphs
        if graphs is not None and step.max_seqlen_q == 1 and graphs.fits(len(step.input_ids)):
            hidden = graphs.replay(step.input_ids, step.positions, step.seq_lens, step.block_tables,
                                   step.slot_mapping, step.lora_slot_ids)
        elif verify is not None and verify.fits_chunks(len(step.seq_lens), step.max_seqlen_q):
            hidden = verify.replay_chunks(step.input_ids, step.positions, step.cu_seqlens_q, step.seq_lens,
                                          step.block_tables, step.slot_mapping)
        else:
            input_ids, positions, meta, _ = self._to_device(step)
            set_context(ForwardContext(meta, self._lora_batch(step)))
            try:
                hidden = self.model(input_ids, positions)
            finally:
                set_context(None)
        sample_rows = step.sample_rows
        if not sample_rows or (self.rank > 0 and tp_size() == 1):   # a replicated LM head: only rank 0 samples
            return None
        return self.model.compute_logits(hidden[sample_rows])

    def _lora_batch(self, step: StepInputs):
        if step.lora_slot_ids is None:
            return None
        slot_ids = step.lora_slot_ids.to(self.device, non_blocking=True)
        return slot_ids, ops.lora_plan(slot_ids, self.config.max_loras)   # once per forward, shared by every layer

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, block_manager: BlockManager
            ) -> tuple[list[list[int]], list[list[TokenLogprobs | None]]]:
        """Runs one step; returns, per scheduled sequence, its new tokens (none mid-prefill; several when
        drafts were accepted) and their logprobs."""
        step = self.prepare_host(batch, block_manager)
        if self.workers is None:
            logits = self.execute(step)
        else:
            self.workers.send(step)
            with self.workers.guard():
                logits = self.execute(step)
        sampled: list[list[int]] = [[] for _ in batch.seqs]
        logprobs: list[list[TokenLogprobs | None]] = [[] for _ in batch.seqs]
        if logits is None:
            return sampled, logprobs
        if len(step.sample_seqs) == len(set(step.sample_seqs)):   # no drafts: one row per sequence
            tokens, token_logprobs = self.sampler(logits, [batch.seqs[i] for i in step.sample_seqs])
            for i, token, lp in zip(step.sample_seqs, tokens, token_logprobs):
                sampled[i], logprobs[i] = [token], [lp]
            return sampled, logprobs
        indices = list(dict.fromkeys(step.sample_seqs))
        seqs = [batch.seqs[i] for i in indices]
        tokens, token_logprobs = self.sampler.verify(logits, seqs, [seq.draft_token_ids for seq in seqs])
        for i, seq_tokens, lps in zip(indices, tokens, token_logprobs):
            sampled[i], logprobs[i] = seq_tokens, lps
        return sampled, logprobs
