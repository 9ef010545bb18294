"""Structured output's loop guard (runtime/structured/loop_guard.py): the token that would repeat a block a fourth
time is banned in a constrained sequence's row, in plain sampling and in speculative verification, and nothing else
is touched. On the trained model: tests/runtime/test_structured_trained.py."""
import random

import pytest
import torch

from kubeinfer.runtime.engine.messages import EngineStats
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.layers import sampler as sampler_module
from kubeinfer.runtime.layers.sampler import Sampler
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.metrics import EngineMetrics
from kubeinfer.runtime.structured.loop_guard import MAX_PERIOD, MIN_SPAN, REPEATS, ban_loops, loop_continuation

BLOCK = [11, 12, 13, 14, 15, 16]   # e.g. `"Fantasy", "` in six tokens
VOCAB = 32


@pytest.mark.parametrize("output, expected", [
    ([1, 2] + BLOCK * 3, BLOCK[0]),                      # three repeats over 18 tokens: the fourth is refused
    ([1, 2] + BLOCK * 3 + BLOCK[:2], BLOCK[2]),          # inside the fourth: its next token
    ([1, 2] + BLOCK * 2, None),                          # two repeats
    ([7] * (MIN_SPAN - 1), None),                        # a run of one digit shorter than the span
    ([7] * MIN_SPAN, 7),
    ([3, 4] * 7, None),                                  # seven repeats of two tokens: 14 < 16
    ([3, 4] * 8, 3),
    (BLOCK * 3 + [3, 4] * 8, 3),                         # the shortest block wins
    (list(range(40)), None),
    ([], None),
])
def test_a_block_repeated_three_times_over_the_span_is_a_loop(output, expected):
    assert loop_continuation(output) == expected


def reference(output: list[int]) -> int | None:
    """Every period from 1, every token of its span compared: what the guard's search must find."""
    n = len(output)
    for period in range(1, MAX_PERIOD + 1):
        span = period * max(REPEATS, -(-MIN_SPAN // period))
        if span <= n and all(output[n - span + i] == output[n - span + i + period] for i in range(span - period)):
            return output[n - period]
    return None


def test_the_search_finds_what_comparing_every_period_finds():
    generator = random.Random(0)
    for _ in range(3000):
        alphabet = generator.choice([2, 3, 5, 50])
        output = [generator.randrange(alphabet) for _ in range(generator.randrange(150))]
        if output and generator.random() < 0.5:   # a loop of a random block after a random prefix, maybe unfinished
            block = output[:generator.randrange(1, 24)]
            output = output[:generator.randrange(30)] + block * generator.randrange(2, 8) + block[:generator.randrange(
                len(block))]
        assert loop_continuation(output) == reference(output), output


def constrained(output: list[int], guided: bool = True) -> Sequence:
    seq = Sequence("r", [BLOCK[0], BLOCK[1], 2], SamplingParams(temperature=0))   # the prompt does not count
    for token in output:
        seq.append_token(token)
    seq.guide = object() if guided else None
    return seq


def test_only_the_loops_token_in_a_constrained_row_is_banned():
    logits = torch.zeros(3, VOCAB)
    seqs = [constrained(BLOCK * 3), constrained(BLOCK * 3, guided=False), constrained(BLOCK * 2)]
    assert ban_loops(logits, seqs) == 1
    assert logits[0, BLOCK[0]] == float("-inf") and torch.isfinite(logits[0]).sum() == VOCAB - 1
    assert torch.isfinite(logits[1:]).all()


def test_the_last_token_the_grammar_allows_is_never_banned():
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, BLOCK[0]] = 1.0
    assert ban_loops(logits, [constrained(BLOCK * 3)]) == 0
    assert logits[0, BLOCK[0]] == 1.0


def test_the_loop_is_read_across_the_prompt_boundary_only_from_the_output():
    # The prompt ends with two of the block's tokens; the output alone holds less than three repeats.
    logits = torch.zeros(1, VOCAB)
    ban_loops(logits, [constrained(BLOCK[2:] + BLOCK * 2)])
    assert torch.isfinite(logits).all()


@pytest.fixture
def no_grammar_mask(monkeypatch):
    """The sampler with the grammar's mask left out (the guard alone): each sequence's `guide` is a stand-in."""
    monkeypatch.setattr(sampler_module, "apply_grammars", lambda *args: None)


def test_greedy_sampling_takes_the_next_token_instead_of_the_loop(no_grammar_mask):
    logits = torch.zeros(2, VOCAB)
    logits[:, BLOCK[0]], logits[:, 30] = 5.0, 4.0   # the loop's token first, the list's end second
    sampler = Sampler((0,))
    tokens, _ = sampler(logits, [constrained(BLOCK * 3), constrained(BLOCK * 3, guided=False)])
    assert tokens == [30, BLOCK[0]] and sampler.loop_bans == 1


def test_the_replicas_switch_turns_the_guard_off(no_grammar_mask):
    from kubeinfer.runtime.cli import build_parser, engine_settings
    args = build_parser().parse_args(["serve", "--model", "demo", "--no-structured-loop-guard"])
    assert engine_settings(args)["structured_loop_guard"] is False   # --no-structured-loop-guard reaches the config
    logits = torch.zeros(1, VOCAB)
    logits[:, BLOCK[0]], logits[:, 30] = 5.0, 4.0
    sampler = Sampler((0,), loop_guard=False)
    assert sampler(logits, [constrained(BLOCK * 3)])[0] == [BLOCK[0]] and sampler.loop_bans == 0


def test_a_draft_that_continues_the_loop_is_refused(no_grammar_mask):
    # Output: two repeats and most of a third; drafts finish the third (allowed) and start a fourth (refused).
    seq = constrained(BLOCK * 2 + BLOCK[:4])
    drafts = [[BLOCK[4], BLOCK[5], BLOCK[0]]]
    logits = torch.zeros(4, VOCAB)
    for row, token in enumerate(drafts[0]):
        logits[row, token] = 5.0
    logits[:, 30] = 4.0
    tokens, _ = Sampler((0,)).verify(logits, [seq], drafts)
    assert tokens == [[BLOCK[4], BLOCK[5], 30]]


def test_the_bans_are_counted_in_the_replicas_metrics():
    metrics = EngineMetrics("m")
    for bans in (2, 2, 5):   # the engine's count since start, read after each step
        metrics.observe_stats(EngineStats(1, 0, 0.1, 0, 0, 0, structured_loop_bans=bans), 0.01)
    assert metrics.registry.get_sample_value("kubeinfer_structured_loop_bans_total", {"model_name": "m"}) == 5
