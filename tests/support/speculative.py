"""Speculative decoding's test helpers: prompts where lookup proposes, an engine run, plain output compared."""
import random

import pytest

from kubeinfer.runtime.llm import LLM

LLM_VOCAB = 384   # the test models' vocabulary (tests/runtime/conftest.py)
LOGPROB_ATOL = 1e-4


def repetitive_prompts(seed: int, vocab: int, every_token: bool = False) -> list[list[int]]:
    """Mixed lengths; repeated passages (where lookup proposes) and one random prompt; two share a prefix.
    `every_token`: one more prompt holds each token id once, so the first lookup of any output token finds
    it there, followed by a random token: a proposal that is nearly always wrong."""
    rng = random.Random(seed)
    passage = [rng.randrange(1, vocab) for _ in range(23)]
    shared = [rng.randrange(1, vocab) for _ in range(40)]
    prompts = [passage * 3, passage[:7] * 6 + [3], [rng.randrange(1, vocab) for _ in range(50)],
               shared + passage[:9] * 2, shared + [5, 6, 7, 8] * 5, [9, 4] * 3]
    return prompts + [rng.sample(range(vocab), vocab)] if every_token else prompts


def generate(model_dir, prompts, params, **settings):
    settings = {"block_size": 8, "max_num_batched_tokens": 48, **settings}
    llm = LLM(str(model_dir), **settings)
    outputs = llm.generate(prompts, params)
    return llm, outputs


def assert_same(ours, plain) -> None:
    for output, reference in zip(ours, plain, strict=True):
        assert output.token_ids == reference.token_ids
        assert output.text == reference.text
        assert (output.finish_reason, output.stop_reason) == (reference.finish_reason, reference.stop_reason)
        for mine, theirs in zip(output.logprobs, reference.logprobs, strict=True):
            assert mine.token_id == theirs.token_id
            assert mine.logprob == pytest.approx(theirs.logprob, abs=LOGPROB_ATOL)
            assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]
