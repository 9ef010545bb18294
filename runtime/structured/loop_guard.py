"""A constrained answer's loop guard: the grammar keeps an answer legal, not finished. A small model can fall into a
loop the grammar allows forever (a list repeating one item, a string repeating one phrase) and write it until
max_tokens. When an answer's last tokens are one block repeated REPEATS times in a row, and span at least MIN_SPAN
tokens, the token that would start the block once more is banned for that step (never the last token the grammar
allows), and the model writes what it ranks next: mostly the list's or the string's end.

Measured on SmolLM2-135M-Instruct (benchmarks/structured_quality.py; docs/server.md, "Structured output"). What it
costs a legitimate answer: a value that really repeats one block three times over 16 or more tokens (a 4 x 4 zero
matrix, the same long string four times in a list) cannot go on repeating it; shorter repeats (digits, `[0, 0, 0]`,
indentation) are untouched.
"""
import torch

REPEATS = 3
MIN_SPAN = 16          # tokens: the repeats must cover at least this many (a run of one digit is no loop)
MAX_PERIOD = 64        # the longest block looked for, in tokens


def loop_continuation(output: list[int], repeats: int = REPEATS, min_span: int = MIN_SPAN,
                      max_period: int = MAX_PERIOD) -> int | None:
    """The token that would start one more repeat of the block `output` ends with `repeats` times over, or None.
    The shortest such block wins. Only periods at which the last token recurs are tried (found by the list's own
    search): a step of 64 sequences costs well under a millisecond."""
    n = len(output)
    if n < min_span:
        return None
    stop = n - max_period - 2
    backwards = output[:stop if stop >= 0 else None:-1]   # backwards[p] is output[-1 - p], p <= max_period
    period = 0
    while True:
        try:
            period = backwards.index(backwards[0], period + 1)
        except ValueError:
            return None
        if period * repeats > n:
            return None
        span = period * max(repeats, -(-min_span // period))   # whole repeats, at least min_span tokens
        if span > n or output[-2] != output[-2 - period]:
            continue
        tail = output[n - span:]
        if tail[:-period] == tail[period:]:
            return output[n - period]


def ban_loops(logits: torch.Tensor, seqs: list, extras: list[list[int]] | None = None) -> int:
    """Bans, in the rows of constrained sequences, the token that would extend a loop (see the module's doc), where
    the grammar leaves another; returns how many rows had one banned. `extras[row]`: tokens taken as output after the
    sequence's own (drafts)."""
    banned = 0
    for row, seq in enumerate(seqs):
        if seq.guide is None:
            continue
        window = min(seq.num_output_tokens, REPEATS * MAX_PERIOD + MIN_SPAN)
        output = seq.token_ids[len(seq.token_ids) - window:] + (list(extras[row]) if extras else [])
        token = loop_continuation(output)
        if token is not None and int(torch.isfinite(logits[row]).sum()) > 1:
            logits[row, token] = float("-inf")
            banned += 1
    return banned
