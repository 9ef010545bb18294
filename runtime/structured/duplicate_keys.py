"""A constrained answer's object ends once it repeats a key.

Where a schema leaves an object open (`additionalProperties`, a free-form `object`), the grammar allows any key,
the same one again included, and a small model goes round on one: `"id": 40, "id": 41, "id": 42, ...` or
`"status_message": "Hello", "status_message": "Hello", ...` until max_tokens. RFC 8259 says an object's names
SHOULD be unique, and a parser keeps only one of the repeats: an object that writes a key again is going round.
The guard follows the answer's JSON structure (`KeyScan`: its objects and arrays, their keys so far, whether a
string is a key) and, once an object has written a key it already had, bans the comma that would open another
member of it (`,` after a value; a token that closes inner brackets or a string value first and then writes the
comma, `},` or `",`, as well), where the grammar leaves another token: the model then ends the object, or goes on
with the value. The answer keeps the one repeat (valid
JSON; a parser keeps its later value).

Banning the repeated key itself instead (its closing quote) was measured and not kept: the model went on writing
into the key (`"id_trace_id_trace_id: 1, "...`) and the corpus sample answered no more validly. Keys are compared
as written (the raw bytes between the quotes): `"a"` and `"\\u0061"` are two keys to the guard. Same switch as the
loop guard (`--no-structured-loop-guard`), counted with its bans. Measured on SmolLM2-135M-Instruct (the corpus
sample of tests/runtime/test_structured_corpus.py; docs/server.md).
"""
import copy

import torch


def comma_depth(text: bytes) -> int:
    """Where a token written after a value's start, outside any string, puts a comma before anything else of the
    structure: after how many closing brackets (0: in the container at hand; `0,` and `},` give 0 and 1), or -1 (no
    comma first: a quote, `{`, `[` or `:` comes first, or none at all)."""
    closed = 0
    for byte in text:
        if byte == 0x2C:
            return closed
        if byte in b"}]":
            closed += 1
        elif byte in b'"{[:':
            return -1
    return -1


def comma_depth_from_string(text: bytes) -> int:
    """The same for a token written inside a string (not right after a backslash): after the string ends in it."""
    escaped = False
    for index, byte in enumerate(text):
        if escaped:
            escaped = False
        elif byte == 0x5C:
            escaped = True
        elif byte == 0x22:
            return comma_depth(text[index + 1:])
    return -1


class CommaTokens:
    """Where each token of a vocabulary opens another member (`comma_depth`): written after a value, and from inside
    a string value (its closing quote, maybe brackets, and a comma in one token)."""

    def __init__(self, token_bytes: list[bytes], vocab_size: int):
        self.after_value = torch.full((vocab_size,), -1, dtype=torch.int8)
        self.from_string = torch.full((vocab_size,), -1, dtype=torch.int8)
        for token, text in enumerate(token_bytes):
            self.after_value[token] = min(comma_depth(text), 127)
            self.from_string[token] = min(comma_depth_from_string(text), 127)


class _Object:
    __slots__ = ("keys", "expects_key", "repeated")

    def __init__(self):
        self.keys: set[bytes] = set()
        self.expects_key = True   # after `{` and after each `,`: the next string is a key
        self.repeated = False     # a key was written a second time


class KeyScan:
    """One answer's JSON structure, advanced over its tokens as they come: the open objects (None for an array) with
    their keys, and the string being written, when it is a key."""

    def __init__(self, token_bytes: list[bytes], commas: CommaTokens):
        self.token_bytes, self.commas = token_bytes, commas
        self.scanned = 0                        # output tokens read so far
        self.stack: list[_Object | None] = []
        self.inside = self.escaped = False
        self.key: bytearray | None = None       # the key being written (None: not in a key)

    def advance(self, token_ids: list[int], num_output: int) -> "KeyScan":
        """Reads the output tokens not read yet (the last `num_output` of `token_ids` are the output so far)."""
        for index in range(len(token_ids) - num_output + self.scanned, len(token_ids)):
            self._read(token_ids[index])
        self.scanned = num_output
        return self

    def after(self, extra: list[int]) -> "KeyScan":
        """The state after `extra` more tokens (drafts), this one left as it is."""
        if not extra:
            return self
        fork = copy.copy(self)
        fork.stack = [copy.copy(frame) for frame in self.stack]
        for frame in fork.stack:
            if frame is not None:
                frame.keys = set(frame.keys)
        fork.key = None if self.key is None else bytearray(self.key)
        for token in extra:
            fork._read(token)
        return fork

    def _read(self, token: int) -> None:
        text = self.token_bytes[token] if token < len(self.token_bytes) else b""
        for byte in text:
            if self.inside:
                self._read_in_string(byte)
            elif byte == 0x22:   # a string opens: a key where its object expects one
                self.inside = True
                top = self.stack[-1] if self.stack else None
                if top is not None and top.expects_key:
                    top.expects_key = False
                    self.key = bytearray()
            elif byte == 0x7B:   # {
                self.stack.append(_Object())
            elif byte == 0x5B:   # [
                self.stack.append(None)
            elif byte in (0x7D, 0x5D):   # } ]
                if self.stack:
                    self.stack.pop()
            elif byte == 0x2C and self.stack and self.stack[-1] is not None:   # , in an object
                self.stack[-1].expects_key = True

    def _read_in_string(self, byte: int) -> None:
        if self.escaped:
            self.escaped = False
        elif byte == 0x5C:   # backslash
            self.escaped = True
        elif byte == 0x22:
            self.inside = False
            if self.key is not None:
                top, key = self.stack[-1], bytes(self.key)
                top.repeated = top.repeated or key in top.keys
                top.keys.add(key)
                self.key = None
            return
        if self.key is not None:
            self.key.append(byte)

    def repeating_depths(self) -> tuple[bool, tuple[int, ...]] | None:
        """Where a comma would open another member of an object that repeated a key: (whether a string value is open,
        the depths of such objects counted from the innermost container, 0 being it), or None (none, or a key or an
        escape is being written)."""
        if self.key is not None or (self.inside and self.escaped):
            return None
        depths = tuple(depth for depth, frame in enumerate(reversed(self.stack))
                       if frame is not None and frame.repeated and not (depth == 0 and frame.expects_key))
        return (self.inside, depths) if depths else None

    def member_openers(self) -> torch.Tensor | None:
        """The tokens that would open another member of an object that repeated a key (None: there are none)."""
        where = self.repeating_depths()
        if where is None:
            return None
        inside, depths = where
        table = self.commas.from_string if inside else self.commas.after_value
        return torch.isin(table, torch.tensor(depths, dtype=table.dtype))


def end_repeating_objects(logits: torch.Tensor, seqs: list, extras: list[list[int]] | None = None) -> int:
    """In the rows of constrained sequences writing a value of an object that repeated a key, bans the tokens that
    would open another member of it (see the module's doc), unless nothing else would be left; returns how many rows
    it banned in. `extras[row]`: tokens taken as output after the sequence's own (drafts)."""
    banned = 0
    for row, seq in enumerate(seqs):
        if seq.guide is None or seq.key_scan is None:
            continue
        state = seq.key_scan.advance(seq.token_ids, seq.num_output_tokens)
        state = state.after(list(extras[row])) if extras else state
        openers = state.member_openers()
        if openers is None:
            continue
        openers = openers.to(logits.device)
        allowed = torch.isfinite(logits[row])
        if bool((allowed & openers).any()) and bool((allowed & ~openers).any()):
            logits[row].masked_fill_(openers, float("-inf"))
            banned += 1
    return banned
