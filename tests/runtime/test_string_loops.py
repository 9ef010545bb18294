"""The string loop guard (runtime/structured/string_loops.py): which tokens end a string, the answer's lexical state
token by token against a reference lexer, when a string counts as looping, and what the guard does to the logits."""
import json
import random
import re
from types import SimpleNamespace

import pytest
import torch

from kubeinfer.runtime.structured.string_loops import (NGRAM, REPEATED, WINDOW, StringScan, TokenTable,
                                                       close_looping_strings, ends_string)

# A toy vocabulary: single characters, a few multi-character pieces the way BPE merges them, and an empty special.
PIECES = [b"", b"{", b"}", b"[", b"]", b":", b",", b" ", b"\n", b'"', b'",', b'":', b' "', b'\\"', b"\\\\", b"\\",
          b'."', b"ab", b"cd", b"ef", b"gh", b"ij", b"kl", b"mn", b"op", b"qr", b"st", b"uv", b"wx", b"yz"]
LETTERS = list(range(PIECES.index(b"ab"), len(PIECES)))
PIECES += [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz0123456789"]
TABLE = TokenTable(PIECES, vocab_size=len(PIECES) + 3)   # the model's vocabulary may be wider (padding rows)


def tokens_of(text: bytes) -> list[int]:
    """`text` cut greedily into the toy vocabulary's pieces, longest first."""
    out, at = [], 0
    while at < len(text):
        piece = max((p for p in PIECES if p and text.startswith(p, at)), key=len)
        out.append(PIECES.index(piece))
        at += len(piece)
    return out


def reference_inside(text: bytes) -> bool:
    """Whether `text` (a JSON prefix) ends inside a string: what json's own lexer says."""
    doc = text.decode()
    strings = re.compile(r'"(?:[^"\\]|\\.)*"')
    outside = strings.sub("", doc)
    return '"' in outside


@pytest.mark.parametrize(("text", "ends"), [(b'"', True), (b'."', True), (b'\\"', False), (b'\\\\"', True),
                                            (b"ab", False), (b"", False), (b'\\\\\\"', False)])
def test_a_token_ends_a_string_where_its_quote_is_not_escaped(text, ends):
    assert ends_string(text) is ends


def test_the_closing_mask_covers_the_model_vocabulary():
    assert TABLE.closing.shape == (len(PIECES) + 3,)
    assert [PIECES[t] for t in TABLE.closing.nonzero().flatten().tolist()] == [b'"', b'",', b'":', b' "', b'."']


def test_the_scan_agrees_with_a_reference_lexer_at_every_token():
    rng = random.Random(0)
    for _ in range(50):
        value = {"".join(rng.choice("abcdefgh") for _ in range(3)): rng.choice(
            ["x" * rng.randint(0, 5), 'say "hi" \\ back', [1, "ab\\cd"], {"k": '"'}]) for _ in range(4)}
        text = json.dumps(value, indent=rng.choice([None, 2])).encode()
        ids = tokens_of(text)
        scan = StringScan(TABLE)
        for count in range(1, len(ids) + 1):
            scan.advance(ids[:count], count)
            assert scan.inside == reference_inside(b"".join(PIECES[t] for t in ids[:count])), text


OPEN = b'{"ab": "'   # an object whose value string opens with its last token


def loop_text(phrase: bytes, tokens: int) -> list[int]:
    ids = tokens_of(OPEN)
    body = tokens_of(phrase)
    while len(ids) < tokens:
        ids += body
    return ids


def scanned(ids: list[int]) -> StringScan:
    return StringScan(TABLE).advance(ids, len(ids))


def reference_looping(ids: list[int], opened: int) -> bool:
    """The module's rule by brute force, for a string opened by token `opened` and still open."""
    string = ids[opened:]
    repeats = [i >= NGRAM - 1 and tuple(string[i - NGRAM + 1:i + 1]) in
               {tuple(string[j - NGRAM + 1:j + 1]) for j in range(NGRAM - 1, i)} for i in range(len(string))]
    return len(string) >= WINDOW and sum(repeats[-WINDOW:]) >= REPEATED


@pytest.mark.parametrize("phrase", [b"abcdefgh", b"abcdabcdef", b"ab", b"abcdefghijklmnopqrstuvwxyz"])
def test_a_string_loops_when_the_reference_rule_says_so(phrase):
    ids = loop_text(phrase, 3 * WINDOW)
    opened = len(tokens_of(OPEN)) - 1
    verdicts = [scanned(ids[:n]).looping for n in range(opened + 1, len(ids) + 1)]
    assert verdicts == [reference_looping(ids[:n], opened) for n in range(opened + 1, len(ids) + 1)]
    assert verdicts[-1] and not verdicts[0]


def test_a_string_of_new_phrases_never_loops():
    rng = random.Random(1)
    ids = tokens_of(OPEN) + [rng.choice(LETTERS) for _ in range(400)]
    grams = {tuple(ids[i:i + NGRAM]) for i in range(len(ids))}
    assert len(grams) > 0.9 * len(ids)   # few repeats by chance
    assert not any(scanned(ids[:n]).looping for n in range(len(ids)))


def test_keys_and_closed_strings_start_over():
    looping = loop_text(b"abcd", 4 + NGRAM + WINDOW)
    closed = looping + tokens_of(b'", "')   # the string ends and a key starts: nothing of it has repeated yet
    assert scanned(looping).looping and not scanned(closed).looping
    assert scanned(closed).inside


def test_an_escaped_quote_does_not_end_the_string_and_a_pending_escape_is_never_closed():
    ids = loop_text(b'ab\\"', 4 + NGRAM + WINDOW)
    assert scanned(ids).inside and scanned(ids).looping
    pending = scanned(ids + tokens_of(b"\\"))
    assert pending.inside and pending.escaped and not pending.looping   # a quote now would be an escaped one


def test_drafts_are_read_without_moving_the_scan():
    ids = loop_text(b"abcdefgh", 40)
    extra = loop_text(b"abcdefgh", 4 + NGRAM + WINDOW)[40:]
    scan = scanned(ids)
    before = (scan.inside, list(scan.flags), set(scan.seen), scan.scanned)
    ahead = scan.after(extra)
    assert (scan.inside, list(scan.flags), set(scan.seen), scan.scanned) == before
    whole = scanned(ids + extra)
    assert (ahead.looping, list(ahead.flags), ahead.seen) == (whole.looping, list(whole.flags), whole.seen)


def sequence(ids: list[int], constrained: bool = True):
    return SimpleNamespace(token_ids=[7, 7] + ids, num_output_tokens=len(ids), guide=object() if constrained else None,
                           string_scan=StringScan(TABLE) if constrained else None)


def test_a_looping_row_keeps_only_tokens_that_end_the_string():
    ids = loop_text(b"abcdefgh", 4 + NGRAM + WINDOW)
    seqs = [sequence(ids), sequence(ids[:20]), sequence(ids, constrained=False)]
    logits = torch.randn(3, len(PIECES) + 3)
    before = logits.clone()
    assert close_looping_strings(logits, seqs) == 1
    assert torch.equal(torch.isfinite(logits[0]), TABLE.closing)
    assert torch.equal(logits[0][TABLE.closing], before[0][TABLE.closing])
    assert torch.equal(logits[1:], before[1:])


def test_a_row_whose_grammar_allows_no_end_is_left_alone():
    ids = loop_text(b"abcdefgh", 4 + NGRAM + WINDOW)
    logits = torch.randn(1, len(PIECES) + 3)
    logits[0, TABLE.closing] = float("-inf")   # e.g. minLength not reached yet
    before = logits.clone()
    assert close_looping_strings(logits, [sequence(ids)]) == 0
    assert torch.equal(logits, before)


def test_draft_rows_are_judged_after_their_drafts():
    ids = loop_text(b"abcdefgh", 4 + NGRAM + WINDOW)
    short, rest = ids[:-12], ids[-12:]
    seq = sequence(short)
    rows = [seq] * 3
    logits = torch.randn(3, len(PIECES) + 3)
    closed = close_looping_strings(logits, rows, [[], rest[:6], rest])
    assert closed == 1 and torch.isfinite(logits[:2]).all() and torch.equal(torch.isfinite(logits[2]), TABLE.closing)
