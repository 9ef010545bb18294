"""The repeated-key guard (runtime/structured/duplicate_keys.py): which tokens open another member, the answer's JSON
structure token by token against the truth its writer records byte by byte, and what the guard does to the logits."""
import random
from types import SimpleNamespace

import pytest
import torch

from kubeinfer.runtime.structured.duplicate_keys import (CommaTokens, KeyScan, comma_depth, comma_depth_from_string,
                                                         end_repeating_objects)


@pytest.mark.parametrize(("text", "depth"), [(b",", 0), (b" ,\n", 0), (b"0,", 0), (b"e,", 0), (b"},", 1),
                                             (b"\n  }\n],", 2), (b"]", -1), (b'"', -1), (b"12", -1), (b"", -1),
                                             (b":,", -1), (b"{,", -1)])
def test_a_token_after_a_value_puts_its_comma_after_the_brackets_it_closes(text, depth):
    assert comma_depth(text) == depth


@pytest.mark.parametrize(("text", "depth"), [(b'",', 0), (b'" ,', 0), (b'ab",', 0), (b'"},', 1), (b'"}', -1),
                                             (b'\\",', -1), (b'\\\\",', 0), (b"a,b", -1), (b'"', -1)])
def test_a_token_inside_a_string_puts_its_comma_after_the_string_ends(text, depth):
    assert comma_depth_from_string(text) == depth


class Writer:
    """Writes a JSON document byte by byte (duplicate keys allowed) and records after each byte what the guard should
    see: whether a string value is open, and where the objects that repeated a key stand (None: nowhere to ban)."""

    def __init__(self, rng: random.Random):
        self.rng, self.out, self.truth = rng, bytearray(), []
        self.frames: list[dict | None] = []   # an object: its keys, whether one repeated, its phase; None: an array
        self.inside = self.escaped = False

    def expected(self) -> tuple[bool, tuple[int, ...]] | None:
        top = self.frames[-1] if self.frames else None
        if (self.inside and top is not None and top["phase"] == "key") or (self.inside and self.escaped):
            return None   # a key or an escape is being written
        depths = tuple(depth for depth, frame in enumerate(reversed(self.frames))
                       if frame is not None and frame["repeated"] and not (depth == 0 and frame["phase"] == "key"))
        return (self.inside, depths) if depths else None

    def emit(self, text: bytes) -> None:
        for byte in text:
            self.out.append(byte)
            self.truth.append(self.expected())

    def space(self) -> None:
        self.emit(self.rng.choice([b"", b" ", b"\n  "]))

    def string(self, text: bytes) -> None:
        self.emit(b'"')
        self.inside = True
        self.truth[-1] = self.expected()
        for byte in text:
            self.escaped = byte == 0x5C and not self.escaped
            self.emit(bytes([byte]))
        self.inside = False
        self.emit(b'"')

    def value(self, depth: int) -> None:
        kinds = ["object", "array", "string", "number", "literal"] if depth < 3 else ["string", "number"]
        kind = self.rng.choice(kinds)
        if kind == "object":
            self.obj(depth + 1)
        elif kind == "array":
            self.emit(b"[")
            self.frames.append(None)
            self.truth[-1] = self.expected()
            for index in range(self.rng.randint(0, 3)):
                if index:
                    self.emit(b",")
                    self.space()
                self.value(depth)
            self.frames.pop()
            self.emit(b"]")
        elif kind == "string":
            self.string(self.rng.choice([b"", b"ab", b'say \\"hi\\"', b"a\\\\", b"{[,]}", b'\\"', b"x,y"]))
        else:
            self.emit(self.rng.choice([b"0", b"-12.5e3", b"7"] if kind == "number" else [b"true", b"null"]))

    def obj(self, depth: int) -> None:
        self.emit(b"{")
        frame = {"keys": set(), "repeated": False, "phase": "key"}
        self.frames.append(frame)
        self.truth[-1] = self.expected()
        for index in range(self.rng.randint(0, 5)):
            if index:
                frame["phase"] = "key"
                self.emit(b",")
                self.space()
            key = self.rng.choice([b"a", b"id", b"i", b'q\\"', b"x,y"])
            self.string(key)
            frame["repeated"] = frame["repeated"] or key in frame["keys"]
            frame["keys"].add(key)
            frame["phase"] = "value"
            self.truth[-1] = self.expected()
            self.space()
            self.emit(b":")
            self.space()
            self.value(depth)
        self.space()
        self.frames.pop()
        self.emit(b"}")


def pieces(text: bytes, rng: random.Random) -> list[bytes]:
    """`text` cut at random into pieces of 1-4 bytes, as a tokenizer's merges would."""
    out, at = [], 0
    while at < len(text):
        size = rng.randint(1, 4)
        out.append(bytes(text[at:at + size]))
        at += size
    return out


def test_the_scan_agrees_with_the_writer_at_every_token():
    rng = random.Random(0)
    seen = set()
    for _ in range(300):
        writer = Writer(rng)
        writer.obj(0)
        chunks = pieces(bytes(writer.out), rng)
        vocabulary = sorted(set(chunks))
        ids = [vocabulary.index(chunk) for chunk in chunks]
        commas = CommaTokens(vocabulary, len(vocabulary))
        scan, at = KeyScan(vocabulary, commas), 0
        for count in range(1, len(ids) + 1):
            scan.advance(ids[:count], count)
            at += len(chunks[count - 1])
            expected = writer.truth[at - 1]
            assert scan.repeating_depths() == expected, (bytes(writer.out[:at]), expected)
            seen.add(expected if expected is None else (expected[0], len(expected[1]) > 1))
    assert seen == {None, (False, False), (True, False), (False, True), (True, True)}   # nested repeats too


def test_drafts_are_read_on_a_copy():
    vocabulary = [b'{"a": 1', b', "a', b'": 2', b"}"]
    scan = KeyScan(vocabulary, CommaTokens(vocabulary, len(vocabulary))).advance([0], 1)
    fork = scan.after([1, 2])
    assert fork.repeating_depths() == (False, (0,))
    assert scan.repeating_depths() is None and scan.stack[-1].keys == {b"a"}
    assert scan.advance([0, 1, 2], 3).repeating_depths() == (False, (0,))   # the same once taken


VOCABULARY = [b'{"id": 1', b', "id', b'": 2', b",", b"}", b"0", b'": "', b'",', b'"}', b'" ,', b"0,"]


def guarded(output: list[int], logits: torch.Tensor, extras=None) -> tuple[torch.Tensor, int]:
    seq = SimpleNamespace(guide=object(), token_ids=[99] + output, num_output_tokens=len(output),
                          key_scan=KeyScan(VOCABULARY, CommaTokens(VOCABULARY, len(VOCABULARY) + 2)))
    logits = logits.clone()
    return logits, end_repeating_objects(logits, [seq], extras)


def test_an_object_that_repeated_a_key_gets_no_more_members():
    logits = torch.zeros(1, len(VOCABULARY) + 2)   # the model's vocabulary may be wider (padding rows)
    banned, count = guarded([0, 1, 2], logits)
    assert count == 1
    assert [VOCABULARY[t] for t in (~torch.isfinite(banned[0])).nonzero().flatten().tolist()] == [b', "id', b",", b"0,"]
    once, count = guarded([0], logits)   # no key repeated: nothing banned
    assert count == 0 and torch.equal(once, logits)


def test_inside_a_string_value_the_quote_and_comma_tokens_are_banned():
    logits = torch.zeros(1, len(VOCABULARY) + 2)
    in_string, count = guarded([0, 1], logits, [[VOCABULARY.index(b'": "')]])   # a draft opened a string value
    assert count == 1
    assert [VOCABULARY[t] for t in (~torch.isfinite(in_string[0])).nonzero().flatten().tolist()] == [b'",', b'" ,']


def test_the_last_tokens_the_grammar_allows_are_never_banned():
    logits = torch.full((1, len(VOCABULARY) + 2), float("-inf"))
    logits[0, VOCABULARY.index(b",")] = 0.0   # the grammar allows a comma only
    banned, count = guarded([0, 1, 2], logits)
    assert count == 0 and torch.equal(banned, logits)


def test_a_token_that_closes_an_inner_object_and_opens_a_member_of_the_repeating_one_is_banned():
    vocabulary = [b'{"id": {"x": 1}', b', "id": {"x": 2', b"},", b"}", b"\n}", b", \"y\""]
    seq = SimpleNamespace(guide=object(), token_ids=[0, 1], num_output_tokens=2,
                          key_scan=KeyScan(vocabulary, CommaTokens(vocabulary, len(vocabulary))))
    logits = torch.zeros(1, len(vocabulary))
    assert end_repeating_objects(logits, [seq]) == 1
    # `},` puts its comma in the outer object, which repeated "id"; `, "y"` one in the inner one, which did not
    assert [vocabulary[t] for t in (~torch.isfinite(logits[0])).nonzero().flatten().tolist()] == [b"},"]
