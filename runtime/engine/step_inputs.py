"""One step's inputs: the scheduled batch flattened into host tensors (rank 0 builds them, and sends them to the
other ranks), then moved onto a rank's device with their attention metadata."""
from dataclasses import dataclass, field, fields

import torch

from kubeinfer.kernels.metadata import AttentionMetadata
from kubeinfer.runtime.engine.block_manager import BlockManager, slot_mapping
from kubeinfer.runtime.engine.scheduler import ScheduledBatch


@dataclass
class StepInputs:
    """Host tensors of one step."""
    input_ids: torch.Tensor        # int64 [num_tokens]
    positions: torch.Tensor        # int64 [num_tokens]
    cu_seqlens_q: torch.Tensor     # int32 [num_seqs + 1]
    seq_lens: torch.Tensor         # int32 [num_seqs]
    block_tables: torch.Tensor     # int32 [num_seqs, blocks of the longest]
    slot_mapping: torch.Tensor     # int64 [num_tokens]
    max_seqlen_q: int
    max_seqlen_k: int
    sample_rows: list[int]         # token rows whose logits are sampled
    sample_seqs: list[int]         # the batch index of the sequence each of those rows belongs to
    lora_slot_ids: torch.Tensor | None = None   # int64 [num_tokens]: each token's adapter slot; None: no adapter
    lora_loads: list[tuple[int, str, str, str]] = field(default_factory=list)   # (slot, name, folder, digest) to fill first

    def astuple(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


def lora_slot_ids(batch: ScheduledBatch, base_slot: int) -> torch.Tensor | None:
    """Each new token's adapter slot (`base_slot` for the base model's), or None when no sequence has one."""
    if all(seq.lora_slot is None for seq in batch.seqs):
        return None
    slots = torch.tensor([base_slot if seq.lora_slot is None else seq.lora_slot for seq in batch.seqs])
    return torch.repeat_interleave(slots, torch.tensor(batch.num_new_tokens))


def build_step_inputs(batch: ScheduledBatch, block_manager: BlockManager, block_size: int) -> StepInputs:
    """Each sequence's new tokens (a decoding one's last token then its drafts), their positions, KV slots and
    block-table rows, and which rows are sampled."""
    num_decodes = batch.num_decodes   # first, in bulk: each one's last token, at its last position, sampled
    decodes = batch.seqs[:num_decodes]
    input_ids: list[int] = [seq.token_ids[-1] for seq in decodes]
    positions: list[int] = [seq.num_computed_tokens for seq in decodes]
    seq_lens = [position + 1 for position in positions]
    rows = [block_manager.rows[seq.seq_id] for seq in decodes]
    cu_seqlens_q, sample_rows, sample_seqs = list(range(num_decodes + 1)), list(range(num_decodes)), \
        list(range(num_decodes))
    for index, (seq, num_new) in enumerate(zip(batch.seqs[num_decodes:], batch.num_new_tokens[num_decodes:]),
                                           start=num_decodes):
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        drafts = seq.draft_token_ids
        if num_new == 1:
            input_ids.append(seq.token_ids[start])
            positions.append(start)
        else:
            input_ids.extend(seq.token_ids[start:end])
            input_ids.extend(drafts)   # a decoding sequence's last token, then its drafts
            positions.extend(range(start, end))
        cu_seqlens_q.append(cu_seqlens_q[-1] + num_new)
        seq_lens.append(end)
        rows.append(block_manager.row(seq))
        if end == seq.num_tokens + len(drafts):   # the last known token, and each draft, is sampled
            sample_rows.extend(range(cu_seqlens_q[-1] - 1 - len(drafts), cu_seqlens_q[-1]))
            sample_seqs.extend([index] * (1 + len(drafts)))
    max_seqlen_k = max(seq_lens)
    tables = torch.from_numpy(block_manager.tables[rows, :-(-max_seqlen_k // block_size)])
    positions_t = torch.tensor(positions, dtype=torch.int64)
    if len(positions) == len(rows):   # decode only: one token per sequence
        owner = torch.arange(len(rows))
    else:
        owner = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(batch.num_new_tokens))
    slots = slot_mapping(tables, owner, positions_t, block_size)
    return StepInputs(
        input_ids=torch.tensor(input_ids, dtype=torch.int64), positions=positions_t,
        cu_seqlens_q=torch.tensor(cu_seqlens_q, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=tables, slot_mapping=slots,
        max_seqlen_q=max(batch.num_new_tokens), max_seqlen_k=max_seqlen_k, sample_rows=sample_rows,
        sample_seqs=sample_seqs, lora_loads=batch.lora_loads)


def step_to_device(step: StepInputs, device: torch.device):
    """(input ids, positions, attention metadata, rows to sample) on `device`."""
    to_device = {"device": device, "non_blocking": True}
    meta = AttentionMetadata(
        cu_seqlens_q=step.cu_seqlens_q.to(**to_device), seq_lens=step.seq_lens.to(**to_device),
        block_tables=step.block_tables.to(**to_device), max_seqlen_q=step.max_seqlen_q,
        max_seqlen_k=step.max_seqlen_k, slot_mapping=step.slot_mapping.to(**to_device))
    return step.input_ids.to(**to_device), step.positions.to(**to_device), meta, step.sample_rows
