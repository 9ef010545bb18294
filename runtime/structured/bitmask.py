"""The grammar's token bitmask for a batch, filled by llguidance's thread pool and applied to the logits in place
(the same torch ops on the CPU and on a GPU: the packed mask, 1 bit per token, is copied to the logits' device
and expanded there).

A sequence with draft tokens (speculation) gets one mask row per draft plus one: row j is the mask after drafts
0..j-1, computed by advancing the matcher through the drafts and rolling it back. Rows after a draft the grammar
refuses are left open: that draft is masked out, so it is never accepted and those rows are never used.
"""
import os

import llguidance
import torch

_SHIFTS = {}
_executor: llguidance.LLExecutor | None = None


def fill_threads() -> int:
    """The fill pool's threads: llguidance's own default, 80% of the CPUs this process may run on, at most 32."""
    return max(1, min(32, int(len(os.sched_getaffinity(0)) * 0.8)))


def _pool() -> llguidance.LLExecutor:
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor(num_threads=fill_threads())
    return _executor


def fill_bitmask(entries: list[tuple[llguidance.LLMatcher, int, list[int]]], num_rows: int,
                 vocab_size: int) -> torch.Tensor:
    """Masks for `entries` of (matcher, first row, drafts); rows no entry fills allow every token."""
    bitmask = torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    row_bytes = bitmask.shape[1] * 4
    plain = [(matcher, row) for matcher, row, drafts in entries if not drafts]
    drafted = [entry for entry in entries if entry[2]]
    if plain:
        _pool().unsafe_compute_mask_ptr(plain, bitmask.data_ptr(), row_bytes, num_rows)
    if drafted:
        _pool().unsafe_compute_mask_ptr_with_draft_token(drafted, bitmask.data_ptr(), row_bytes, num_rows)
    return bitmask


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Sets the logits of `rows` that their mask bans to -inf."""
    device, vocab = logits.device, logits.shape[-1]
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    every_row = len(rows) == logits.shape[0]
    words = (bitmask if every_row else bitmask[rows]).to(device, non_blocking=True)
    banned = ((words.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab] == 0
    if every_row:   # the usual case: one in-place fill, no gather and scatter
        logits.masked_fill_(banned, float("-inf"))
        return
    index = torch.tensor(rows, device=device)
    logits[index] = logits[index].masked_fill(banned, float("-inf"))


def apply_grammars(logits: torch.Tensor, seqs: list, drafts: list[list[int]] | None = None) -> None:
    """Masks the logits of the constrained sequences among `seqs` (one row each; with `drafts`, len + 1 rows each,
    in order)."""
    entries, rows, row = [], [], 0
    for index, seq in enumerate(seqs):
        width = 1 + (len(drafts[index]) if drafts else 0)
        if seq.guide is not None:
            entries.append((seq.guide, row, list(drafts[index]) if drafts else []))
            rows.extend(range(row, row + width))
        row += width
    if entries:
        apply_bitmask(logits, fill_bitmask(entries, row, logits.shape[-1]), rows)
