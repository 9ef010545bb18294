"""The same request gives the same tokens however it is scheduled."""
import random

import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

TARGETS = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
           SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)]


def target_prompt(llm: LLM) -> list[int]:
    return llm.tokenizer.encode("The key and value cache keeps the attention state of every token already seen.")


def others(count: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 60))] for _ in range(count)]
    params = [SamplingParams(max_tokens=rng.randint(1, 24), temperature=rng.choice([0, 0.7, 1.3]),
                             seed=rng.choice([None, rng.randrange(1000)]), ignore_eos=True) for _ in range(count)]
    return prompts, params


def run(llm: LLM, extra: int = 0) -> list[list[int]]:
    """Token ids of each target, submitted first among `extra` other requests."""
    prompts, params = others(extra, llm.engine.config.model_config.vocab_size)
    prompt = target_prompt(llm)
    outputs = llm.generate([prompt] * len(TARGETS) + prompts, TARGETS + params)
    return [o.token_ids for o in outputs[:len(TARGETS)]]


@pytest.fixture(scope="module")
def alone(llama_dir):
    return run(LLM(str(llama_dir)))


def test_same_tokens_in_a_batch_of_32(llama_dir, alone):
    assert run(LLM(str(llama_dir)), extra=32 - len(TARGETS)) == alone


@pytest.mark.parametrize("chunk", [5, 16, 37])
def test_same_tokens_with_any_prefill_chunk_size(llama_dir, alone, chunk):
    llm = LLM(str(llama_dir), max_num_batched_tokens=chunk)
    assert run(llm, extra=6) == alone


def test_same_tokens_with_and_without_a_prefix_cache_hit(llama_dir, alone):
    llm = LLM(str(llama_dir), block_size=4)
    first = run(llm)
    second = llm.generate([target_prompt(llm)] * 2, TARGETS)   # the prompt's blocks are now cached
    assert all(o.num_cached_tokens > 0 for o in second)
    assert [o.token_ids for o in second] == first == alone
    assert run(LLM(str(llama_dir), enable_prefix_caching=False)) == alone


def test_same_tokens_after_preemption_and_recompute(llama_dir, alone):
    # 14 blocks of 8 tokens cannot hold 8 requests of up to ~40 tokens each: the scheduler must preempt.
    llm = LLM(str(llama_dir), block_size=8, num_kvcache_blocks=14, enable_prefix_caching=False)
    assert run(llm, extra=6) == alone
    assert llm.engine.scheduler.stats.num_preemptions > 0
