"""CUDA graphs for decode steps: one graph per padded batch size, replayed instead of launching every kernel.

A decode step of a small batch is bound by kernel launches, not by the GPU: an 8B Llama launches ~15
kernels per layer, ~500 per token. A graph replays them all in one launch.

Policy:
- Graphs are captured once, after the KV pool is sized (they live in their own memory pool), for batch
  sizes 1, 2, 4, 8, then every multiple of 16 up to `cuda_graph_max_batch_size` (capped at max_num_seqs).
  A decode step of n sequences replays the smallest graph of >= n rows; the extra rows are padding: slot
  -1 (their K/V is not stored) and seq_len 0 (attention writes zeros for them). Larger batches, and any
  step with a prefill chunk, run eagerly.
- Inputs are static buffers the graphs read; a replay first copies the step's host tensors into them.
- The decode attention kernel's split count is fixed at capture from `max_model_len` (its worst case), so a
  graph stays correct however long the sequences grow; the kernel skips splits with no keys.
- Only the forward is captured. The LM head (one large GEMM) and the sampler run eagerly on the rows to sample.
- With LoRA slots (`max_loras` > 0) a second graph per batch size is captured with each row's adapter slot in a
  static buffer (the batched LoRA kernel has no host sync, so it captures); a decode step that carries adapters
  replays it, padding rows and the base model's rows holding slot `max_loras` (they add nothing). Slots are
  filled in place (`LoraWeights.apply`), so a graph reads whatever adapters they hold at replay.
- Speculative decoding (`tokens_per_seq` q > 1): a verify step gives each sequence its last token and up to q - 1
  drafts, and the draft model's catch-up forward a few tokens, so their shapes vary with the drafts. A second set
  of graphs holds q tokens per sequence (cu_seqlens_q = 0, q, 2q, ...): each chunk is padded at its end to q
  tokens (slot -1, nothing stored; `chunk_padding`), its seq_len is its start + q, so its real tokens sit at their
  own positions and see only the keys before them; the padded queries' outputs are dropped. Any step whose chunks
  all have <= q tokens replays it (max_seqlen_q > 1 takes the extend attention kernel, whose grid depends only on
  the number of sequences and q).
- A batch size without a captured graph (nothing captured: the CPU) runs the same static-buffer forward eagerly,
  which is how the padding is tested without a GPU.
"""
import logging
import time

import torch
from torch import nn

from kubeinfer.kernels import ops
from kubeinfer.kernels.metadata import AttentionMetadata
from kubeinfer.runtime.context import ForwardContext, set_context
from kubeinfer.runtime.engine.chunk_padding import pad_chunks

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, ... up to `max_batch_size` (always included)."""
    sizes = [n for n in (1, 2, 4, 8) if n < max_batch_size] + list(range(16, max_batch_size, 16))
    return sorted(set(sizes + [max_batch_size]))


class DecodeGraphs:
    def __init__(self, model: nn.Module, max_batch_size: int, max_blocks_per_seq: int, max_model_len: int,
                 hidden_size: int, dtype: torch.dtype, device: torch.device, max_loras: int = 0,
                 tokens_per_seq: int = 1):
        assert tokens_per_seq == 1 or not max_loras, "LoRA adapters are replayed in decode graphs only"
        self.model = model
        self.max_loras = max_loras
        self.max_model_len = max_model_len
        self.tokens_per_seq = q = tokens_per_seq
        self.batch_sizes = graph_batch_sizes(max_batch_size)
        n = self.batch_sizes[-1]
        self.input_ids = torch.zeros(n * q, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n * q, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n * q,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        # q - 1 more columns: a padded query's keys may reach past the longest sequence's table
        self.block_tables = torch.zeros(n, max_blocks_per_seq + q - 1, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(0, n * q + 1, q, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(n * q, hidden_size, dtype=dtype, device=device)
        self.lora_slot_ids = torch.full((n,), max_loras, dtype=torch.int64, device=device) if max_loras else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.lora_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.num_replays = 0
        self.num_lora_replays = 0

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def _meta(self, batch_size: int) -> AttentionMetadata:
        return AttentionMetadata(
            cu_seqlens_q=self.cu_seqlens_q[:batch_size + 1], seq_lens=self.seq_lens[:batch_size],
            block_tables=self.block_tables[:batch_size], max_seqlen_q=self.tokens_per_seq,
            max_seqlen_k=self.max_model_len + self.tokens_per_seq - 1,
            slot_mapping=self.slot_mapping[:batch_size * self.tokens_per_seq])

    def _forward(self, batch_size: int, with_lora: bool) -> None:
        lora = None
        if with_lora:   # the plan is captured once, before the layers that share it
            slot_ids = self.lora_slot_ids[:batch_size]
            lora = (slot_ids, ops.lora_plan(slot_ids, self.max_loras))
        set_context(ForwardContext(self._meta(batch_size), lora))
        try:
            rows = batch_size * self.tokens_per_seq
            self.hidden[:rows] = self.model(self.input_ids[:rows], self.positions[:rows])
        finally:
            set_context(None)

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every batch size, largest first so that the smaller graphs reuse its memory pool.

        The buffers hold padding while capturing (slot -1, seq_len 0, or q with q tokens a sequence, the base
        model's adapter slot): nothing is written to the KV cache."""
        self.slot_mapping.fill_(-1)
        self.seq_lens.fill_(0 if self.tokens_per_seq == 1 else self.tokens_per_seq)
        pool = None
        variants = [(False, self.graphs)] + ([(True, self.lora_graphs)] if self.lora_slot_ids is not None else [])
        for with_lora, graphs in variants:
            for batch_size in reversed(self.batch_sizes):
                self._forward(batch_size, with_lora)   # warm-up: compiles this shape's kernels outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._forward(batch_size, with_lora)
                pool = pool or graph.pool()
                graphs[batch_size] = graph
        torch.cuda.synchronize()

    def fits(self, num_seqs: int) -> bool:
        return 0 < num_seqs <= self.max_batch_size

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
               block_tables: torch.Tensor, slot_mapping: torch.Tensor,
               lora_slot_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden states of a decode step of `len(input_ids)` sequences (a view of the static output);
        `lora_slot_ids`: each row's adapter slot, None when no row has an adapter."""
        n = input_ids.shape[0]
        batch_size = next(size for size in self.batch_sizes if size >= n)
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.slot_mapping[n:batch_size].fill_(-1)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.seq_lens[n:batch_size].zero_()
        self.block_tables[:n, :block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        graphs = self.graphs
        if lora_slot_ids is not None:
            self.lora_slot_ids[:n].copy_(lora_slot_ids, non_blocking=True)
            self.lora_slot_ids[n:batch_size].fill_(self.max_loras)
            graphs = self.lora_graphs
            self.num_lora_replays += 1
        self._launch(batch_size, graphs, lora_slot_ids is not None)
        return self.hidden[:n]

    def fits_chunks(self, num_seqs: int, max_seqlen_q: int) -> bool:
        """Whether a step of `num_seqs` chunks of at most `max_seqlen_q` tokens replays these graphs."""
        return self.tokens_per_seq > 1 and 0 < num_seqs <= self.max_batch_size and max_seqlen_q <= self.tokens_per_seq

    def replay_chunks(self, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      seq_lens: torch.Tensor, block_tables: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        """The hidden states of a step of chunks of <= q tokens (host tensors, as `StepInputs` holds them), in the
        step's own row order: each chunk padded to q tokens, replayed, the padding's rows dropped."""
        n = seq_lens.shape[0]
        batch_size = next(size for size in self.batch_sizes if size >= n)
        padded = pad_chunks(input_ids, positions, cu_seqlens_q, seq_lens, slot_mapping, self.tokens_per_seq,
                            self.max_model_len - 1)
        rows = n * self.tokens_per_seq
        self.input_ids[:rows].copy_(padded.input_ids, non_blocking=True)
        self.positions[:rows].copy_(padded.positions, non_blocking=True)
        self.slot_mapping[:rows].copy_(padded.slot_mapping, non_blocking=True)
        self.slot_mapping[rows:batch_size * self.tokens_per_seq].fill_(-1)
        self.seq_lens[:n].copy_(padded.seq_lens, non_blocking=True)
        self.seq_lens[n:batch_size].fill_(self.tokens_per_seq)
        self.block_tables[:n, :block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        self._launch(batch_size, self.graphs, False)
        return self.hidden[padded.rows.to(self.hidden.device, non_blocking=True)]

    def _launch(self, batch_size: int, graphs: dict, with_lora: bool) -> None:
        graph = graphs.get(batch_size)
        if graph is None:   # not captured (the CPU): the same forward over the static buffers, eagerly
            with torch.inference_mode():
                self._forward(batch_size, with_lora)
        else:
            graph.replay()
        self.num_replays += 1


def step_graphs(config, max_model_len: int, model: nn.Module, hidden_size: int, dtype: torch.dtype,
                device: torch.device, tokens_per_seq: int = 1) -> DecodeGraphs:
    """Graphs (not yet captured) for `model`'s steps of `tokens_per_seq` tokens a sequence, sized by the engine's
    config (an `EngineConfig`) and the longest sequence it serves (`ModelRunner.max_model_len`)."""
    max_blocks_per_seq = -(-max_model_len // config.block_size)
    return DecodeGraphs(model, min(config.cuda_graph_max_batch_size, config.max_num_seqs), max_blocks_per_seq,
                        max_model_len, hidden_size, dtype, device,
                        config.max_loras if tokens_per_seq == 1 else 0, tokens_per_seq)


def capture_engine_graphs(config, max_model_len: int, model: nn.Module, draft, dtype: torch.dtype,
                          device: torch.device) -> tuple[DecodeGraphs, DecodeGraphs | None]:
    """Captures the engine's graphs: its decode steps; with speculation, its verify steps (the last token and up to
    k drafts a sequence); with a draft model (`draft`, a `DraftModel`, given its own), the draft's one-token forwards
    and its catch-up forwards of up to k + 1 tokens. Returns (decode graphs, verify graphs or None)."""
    started = time.monotonic()
    hidden_size, q = config.model_config.hidden_size, config.speculative_tokens + 1
    decode = step_graphs(config, max_model_len, model, hidden_size, dtype, device)
    verify = (step_graphs(config, max_model_len, model, hidden_size, dtype, device, q) if config.speculative_method
              else None)
    captured = [g for g in (decode, verify) if g is not None]
    if draft is not None:
        draft_hidden = config.draft_model_config.hidden_size
        draft.graphs = step_graphs(config, max_model_len, draft.model, draft_hidden, dtype, device)
        draft.chunk_graphs = step_graphs(config, max_model_len, draft.model, draft_hidden, dtype, device, q)
        captured += [draft.graphs, draft.chunk_graphs]
    for graphs in captured:
        graphs.capture()
    logger.info("captured CUDA graphs for batch sizes up to %d (%d graphs, %s tokens a sequence) in %.1f s",
                decode.max_batch_size, sum(len(g.batch_sizes) for g in captured),
                "/".join(str(g.tokens_per_seq) for g in captured), time.monotonic() - started)
    return decode, verify
