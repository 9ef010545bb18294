"""Owns the device: builds the model and its KV pool, turns a scheduled batch into tensors, runs, samples."""
import logging
import time

import torch

from kubeinfer.kernels import set_backend
from kubeinfer.kernels.metadata import AttentionMetadata
from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.context import ForwardContext, set_context
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.scheduler import ScheduledBatch
from kubeinfer.runtime.layers.attention import PagedAttention
from kubeinfer.runtime.layers.sampler import Sampler, TokenLogprobs
from kubeinfer.runtime.models import MODEL_CLASSES
from kubeinfer.runtime.models.loader import load_weights
from kubeinfer.runtime.parallel import tp_size

logger = logging.getLogger(__name__)
DEFAULT_CPU_KV_CACHE_GIB = 0.5


class ModelRunner:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = config.torch_dtype
        set_backend(config.kernel_backend)
        torch.manual_seed(config.seed)   # draws of requests without a seed
        model_config = config.model_config
        started = time.monotonic()
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = MODEL_CLASSES[model_config.architecture](model_config, config.max_model_len)
        finally:
            torch.set_default_dtype(default_dtype)
        load_weights(self.model, config.model)
        self.model.eval()
        logger.info("loaded %s (%s, %s) in %.1f s", config.model, model_config.architecture, self.dtype,
                    time.monotonic() - started)
        self.num_kv_heads = max(1, model_config.num_kv_heads // tp_size())
        self.num_blocks = self._num_kv_blocks()
        self.kv_cache = torch.zeros(2, model_config.num_layers, self.num_blocks, config.block_size,
                                    self.num_kv_heads, model_config.head_dim, dtype=self.dtype, device=self.device)
        attention_layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        for layer, module in enumerate(attention_layers):
            module.k_cache, module.v_cache = self.kv_cache[0, layer], self.kv_cache[1, layer]
        logger.info("KV cache: %d blocks of %d tokens (%.2f GiB)", self.num_blocks, config.block_size,
                    self.kv_cache.numel() * self.kv_cache.element_size() / 2**30)
        self.sampler = Sampler(model_config.eos_token_ids)

    def _num_kv_blocks(self) -> int:
        config, model_config = self.config, self.config.model_config
        block_bytes = (2 * model_config.num_layers * config.block_size * self.num_kv_heads
                       * model_config.head_dim * self.dtype.itemsize)
        if config.num_kvcache_blocks is not None:
            return config.num_kvcache_blocks
        if config.kv_cache_memory_gib is not None:
            budget = config.kv_cache_memory_gib * 2**30
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - (1 - config.gpu_memory_utilization) * total
        else:
            budget = DEFAULT_CPU_KV_CACHE_GIB * 2**30
        # Never more than every sequence at full length could use.
        most = config.max_num_seqs * config.max_blocks_per_seq + 1
        num_blocks = min(int(budget // block_bytes), most)
        if num_blocks < config.max_blocks_per_seq:
            logger.warning("KV cache of %d blocks cannot hold one sequence of max_model_len %d",
                           num_blocks, config.max_model_len)
        if num_blocks < 1:
            raise MemoryError(f"no memory left for the KV cache (budget {budget / 2**30:.2f} GiB)")
        return num_blocks

    def prepare(self, batch: ScheduledBatch, block_manager: BlockManager):
        """Flattened inputs of one step, its attention metadata, and the rows to sample."""
        input_ids: list[int] = []
        positions: list[int] = []
        cu_seqlens_q, seq_lens, rows, sample_rows = [0], [], [], []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            if num_new == 1:
                input_ids.append(seq.token_ids[start])
                positions.append(start)
            else:
                input_ids.extend(seq.token_ids[start:end])
                positions.extend(range(start, end))
            cu_seqlens_q.append(cu_seqlens_q[-1] + num_new)
            seq_lens.append(end)
            rows.append(block_manager.row(seq))
            if end == seq.num_tokens:
                sample_rows.append(cu_seqlens_q[-1] - 1)
        block_size = self.config.block_size
        max_seqlen_k = max(seq_lens)
        tables = torch.from_numpy(block_manager.tables[rows, :-(-max_seqlen_k // block_size)])
        positions_t = torch.tensor(positions, dtype=torch.int64)
        if len(positions) == len(rows):   # decode only: one token per sequence
            owner = torch.arange(len(rows))
        else:
            owner = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(batch.num_new_tokens))
        slots = tables[owner, positions_t // block_size].long() * block_size + positions_t % block_size
        to_device = {"device": self.device, "non_blocking": True}
        meta = AttentionMetadata(
            cu_seqlens_q=torch.tensor(cu_seqlens_q, dtype=torch.int32).to(**to_device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(**to_device),
            block_tables=tables.to(**to_device),
            max_seqlen_q=max(batch.num_new_tokens),
            max_seqlen_k=max_seqlen_k,
            slot_mapping=slots.to(**to_device),
        )
        inputs = torch.tensor(input_ids, dtype=torch.int64).to(**to_device)
        return inputs, positions_t.to(**to_device), meta, sample_rows

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, block_manager: BlockManager
            ) -> tuple[list[int | None], list[TokenLogprobs | None]]:
        """Runs one step; returns, per scheduled sequence, its sampled token (None mid-prefill) and logprobs."""
        input_ids, positions, meta, sample_rows = self.prepare(batch, block_manager)
        set_context(ForwardContext(meta))
        try:
            hidden = self.model(input_ids, positions)
        finally:
            set_context(None)
        sampled: list[int | None] = [None] * len(batch)
        logprobs: list[TokenLogprobs | None] = [None] * len(batch)
        if not sample_rows:
            return sampled, logprobs
        sampling = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens))
                    if seq.num_computed_tokens + n == seq.num_tokens]
        logits = self.model.compute_logits(hidden[sample_rows])
        tokens, token_logprobs = self.sampler(logits, [batch.seqs[i] for i in sampling])
        for i, token, lp in zip(sampling, tokens, token_logprobs):
            sampled[i], logprobs[i] = token, lp
        return sampled, logprobs
