"""A constrained answer's strings that loop are closed.

The grammar keeps a string legal, not finished. A small model writes `amazon-amazon-amazon-...`, a digit string that
goes round (`1234567890123...`), or one sentence over and over with a word changed (`The JSON Error Message Is
Rejected.  The json error message is rejected. ...`), and nothing in the schema stops it before max_tokens.
loop_guard.py catches a block repeated exactly; these wander. Inside a string (a value or a key) of a constrained
answer, a token *repeats* when the NGRAM tokens ending with it already occurred, in that order, earlier in the same
string. When REPEATED or more of a string's last WINDOW tokens repeat, the string is looping: only tokens that end it
(an unescaped `"`) stay allowed, where the grammar allows one, and the model writes the one it ranks highest.

Measured on SmolLM2-135M-Instruct (benchmarks/structured_quality.py, the corpus sample of
tests/runtime/test_structured_corpus.py; docs/server.md, "Structured output"). What it costs a legitimate answer: a
string whose last WINDOW tokens are nearly all NGRAM-token phrases it already wrote (a markdown table of repeated
cells, a log quoted twice, ASCII art) is ended there. `--no-structured-loop-guard` turns it off with the loop guard.
"""
import copy
from collections import deque

import torch

NGRAM = 4
WINDOW = 64       # tokens: a string is judged on its last WINDOW tokens, once it has that many
REPEATED = 60     # of them repeating: the string is looping


class TokenTable:
    """What the guard needs of each token of a vocabulary: its bytes and whether it can end a string."""

    def __init__(self, token_bytes: list[bytes], vocab_size: int):
        self.token_bytes = token_bytes
        closing = torch.zeros(vocab_size, dtype=torch.bool)
        closing[[token for token, text in enumerate(token_bytes) if ends_string(text)]] = True
        self.closing = closing   # tokens with an unescaped `"`: each ends a string it continues

    @classmethod
    def of(cls, tokenizer, vocab_size: int) -> "TokenTable":
        """The table of an llguidance tokenizer (special tokens have no bytes: they write nothing)."""
        return cls([b"" if tokenizer.is_special_token(token) else tokenizer.decode_bytes([token])
                    for token in range(tokenizer.vocab_size)], vocab_size)


def ends_string(text: bytes) -> bool:
    """Whether a token with `text`, written inside a string (not right after a backslash), ends it."""
    escaped = False
    for byte in text:
        if escaped:
            escaped = False
        elif byte == 0x5C:   # backslash
            escaped = True
        elif byte == 0x22:   # quote
            return True
    return False


class StringScan:
    """One answer's lexical state, advanced over its tokens as they come: whether it is inside a string, and how
    many of the open string's last WINDOW tokens repeat."""

    def __init__(self, table: TokenTable):
        self.table = table
        self.scanned = 0          # output tokens read so far
        self.inside = self.escaped = False
        self._open_string()

    def _open_string(self) -> None:
        self.seen: set[tuple[int, ...]] = set()
        self.tail: list[int] = []                     # the string's last NGRAM - 1 tokens
        self.flags: deque[bool] = deque(maxlen=WINDOW)

    @property
    def looping(self) -> bool:
        return self.inside and not self.escaped and len(self.flags) == WINDOW and sum(self.flags) >= REPEATED

    def advance(self, token_ids: list[int], num_output: int) -> "StringScan":
        """Reads the output tokens not read yet (the last `num_output` of `token_ids` are the output so far)."""
        for index in range(len(token_ids) - num_output + self.scanned, len(token_ids)):
            self._read(token_ids[index])
        self.scanned = num_output
        return self

    def after(self, extra: list[int]) -> "StringScan":
        """The state after `extra` more tokens (drafts), this one left as it is."""
        if not extra:
            return self
        fork = copy.copy(self)
        fork.seen, fork.tail, fork.flags = set(self.seen), list(self.tail), deque(self.flags, maxlen=WINDOW)
        for token in extra:
            fork._read(token)
        return fork

    def _read(self, token: int) -> None:
        text = self.table.token_bytes[token] if token < len(self.table.token_bytes) else b""
        for byte in text:
            if not self.inside:
                if byte == 0x22:
                    self.inside = True
                    self._open_string()
            elif self.escaped:
                self.escaped = False
            elif byte == 0x5C:
                self.escaped = True
            elif byte == 0x22:
                self.inside = False
        if self.inside and text:
            self._count(token)

    def _count(self, token: int) -> None:
        self.tail.append(token)
        if len(self.tail) < NGRAM:
            self.flags.append(False)
            return
        gram = tuple(self.tail)
        del self.tail[0]
        self.flags.append(gram in self.seen)
        self.seen.add(gram)


def close_looping_strings(logits: torch.Tensor, seqs: list, extras: list[list[int]] | None = None) -> int:
    """In the rows of constrained sequences whose open string loops (see the module's doc), leaves only the tokens
    that end it, where the grammar allows one; returns how many rows it closed. `extras[row]`: tokens taken as output
    after the sequence's own (drafts)."""
    closed = 0
    for row, seq in enumerate(seqs):
        if seq.guide is None or seq.string_scan is None:
            continue
        state = seq.string_scan.advance(seq.token_ids, seq.num_output_tokens)
        state = state.after(list(extras[row])) if extras else state
        if not state.looping:
            continue
        closing = state.table.closing.to(logits.device)
        if bool(torch.isfinite(logits[row][closing]).any()):
            logits[row].masked_fill_(~closing, float("-inf"))
            closed += 1
    return closed
