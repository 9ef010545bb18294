"""The draft model of speculative decoding (`--speculative-method draft`): a small model with the target's
tokenizer proposes each decoding sequence's drafts, greedily, one forward per draft position.

Its KV cache mirrors the target's paging: a pool of the same number of blocks, addressed by the same block
tables, so a sequence's draft K/V sit in the same block ids and slots as its target K/V and need no block
manager of their own; memory is sized for both pools together. `Sequence.num_draft_computed` counts the
tokens whose draft K/V are valid. The first proposal forward catches up from there to the end of the context
(the whole prompt at a sequence's first decode, one or two tokens after), and each further forward feeds one
draft. After the target's verification, what the draft computed stays valid up to the tokens the target kept
(`num_computed_tokens`); a preempted sequence starts again from 0. Prefix-cache hits are not trusted for the
draft cache (the blocks' previous owner may never have run the draft over them): the draft recomputes them.
Proposals only ever change speed, never output: the target's verification decides every token.
On the GPU its forwards replay CUDA graphs (`cuda_graphs`): one-token forwards the decode graphs, catch-up forwards
of at most k + 1 tokens a sequence the padded ones; a first catch-up over a whole prompt runs eagerly.
"""
import logging

import torch

from kubeinfer.kernels.metadata import AttentionMetadata
from kubeinfer.runtime.context import ForwardContext, set_context
from kubeinfer.runtime.engine.block_manager import BlockManager, slot_mapping
from kubeinfer.runtime.engine.cuda_graphs import DecodeGraphs
from kubeinfer.runtime.engine.scheduler import ScheduledBatch
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.layers.attention import PagedAttention

logger = logging.getLogger(__name__)


class DraftModel:
    def __init__(self, model: torch.nn.Module, model_config, block_size: int, device: torch.device):
        self.model = model
        self.model_config = model_config
        self.block_size = block_size
        self.device = device
        self.kv_cache: torch.Tensor | None = None
        self.graphs: DecodeGraphs | None = None         # its one-token forwards (CUDA graphs, set by the runner)
        self.chunk_graphs: DecodeGraphs | None = None   # its catch-up forwards of <= k + 1 tokens a sequence

    def block_bytes(self, kv_dtype: torch.dtype) -> int:
        config = self.model_config
        return 2 * config.num_layers * self.block_size * config.num_kv_heads * config.head_dim * kv_dtype.itemsize

    def allocate_kv_cache(self, num_blocks: int, kv_dtype: torch.dtype) -> None:
        config = self.model_config
        self.kv_cache = torch.zeros(2, config.num_layers, num_blocks, self.block_size, config.num_kv_heads,
                                    config.head_dim, dtype=kv_dtype, device=self.device)
        layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        for index, module in enumerate(layers):
            module.k_cache, module.v_cache = self.kv_cache[0, index], self.kv_cache[1, index]
        logger.info("draft model KV cache: %d blocks (%.2f GiB)", num_blocks,
                    self.kv_cache.numel() * self.kv_cache.element_size() / 2**30)

    @torch.inference_mode()
    def propose(self, batch: ScheduledBatch, block_manager: BlockManager) -> None:
        """Fills the draft slots the scheduler reserved (`draft_token_ids`, placeholders) with proposals."""
        seqs = [seq for seq in batch.seqs if seq.draft_token_ids]
        if not seqs:
            return
        limits = [len(seq.draft_token_ids) for seq in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        # Forward 1: from the last valid draft K/V to the end of the context; its last row gives draft 1.
        chunks = [seq.token_ids[seq.num_draft_computed:] for seq in seqs]
        starts = [seq.num_draft_computed for seq in seqs]
        for index, token in enumerate(self._forward(seqs, chunks, starts, block_manager)):
            drafts[index].append(token)
            seqs[index].num_draft_computed = seqs[index].num_tokens
        # Then one token per forward, for the sequences that want more.
        for position in range(1, max(limits)):
            active = [i for i, limit in enumerate(limits) if limit > position]
            chosen = self._forward([seqs[i] for i in active], [[drafts[i][-1]] for i in active],
                                   [seqs[i].num_tokens + position - 1 for i in active], block_manager)
            for index, token in zip(active, chosen):
                drafts[index].append(token)
                seqs[index].num_draft_computed += 1
        for seq, proposal in zip(seqs, drafts):
            seq.draft_token_ids = proposal

    def _forward(self, seqs: list[Sequence], chunks: list[list[int]], starts: list[int],
                 block_manager: BlockManager) -> list[int]:
        """Runs `chunks[i]` at positions `starts[i]...` for each sequence; the argmax after each chunk."""
        block_size, device = self.block_size, self.device
        lengths = [len(chunk) for chunk in chunks]
        seq_lens = [start + n for start, n in zip(starts, lengths)]
        positions = torch.tensor([p for start, n in zip(starts, lengths) for p in range(start, start + n)])
        tables = torch.from_numpy(block_manager.tables[[block_manager.row(seq) for seq in seqs],
                                                       :-(-max(seq_lens) // block_size)])
        owner = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor(lengths))
        slots = slot_mapping(tables, owner, positions, block_size)
        cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        input_ids = torch.tensor([t for chunk in chunks for t in chunk])
        seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
        if self.graphs is not None and max(lengths) == 1 and self.graphs.fits(len(seqs)):
            hidden = self.graphs.replay(input_ids, positions, seq_lens_t, tables, slots)
        elif self.chunk_graphs is not None and self.chunk_graphs.fits_chunks(len(seqs), max(lengths)):
            hidden = self.chunk_graphs.replay_chunks(input_ids, positions, cu_seqlens, seq_lens_t, tables, slots)
        else:
            meta = AttentionMetadata(
                cu_seqlens_q=cu_seqlens.to(device), seq_lens=seq_lens_t.to(device), block_tables=tables.to(device),
                max_seqlen_q=max(lengths), max_seqlen_k=max(seq_lens), slot_mapping=slots.to(device))
            set_context(ForwardContext(meta))
            try:
                hidden = self.model(input_ids.to(device), positions.to(device))
            finally:
                set_context(None)
        last_rows = (cu_seqlens[1:] - 1).to(device)
        return self.model.compute_logits(hidden[last_rows]).argmax(dim=-1).tolist()
