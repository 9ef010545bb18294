"""No KV block leaks, and prefix-cache hits are exactly what the shared prefixes imply."""
import random

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.blocks import assert_no_leak


def test_every_block_is_free_after_a_mixed_workload(llama_dir):
    rng = random.Random(7)
    llm = LLM(str(llama_dir), block_size=8, num_kvcache_blocks=40, max_num_batched_tokens=24)
    vocab = llm.engine.config.model_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 90))] for _ in range(40)]
    params = [SamplingParams(max_tokens=rng.randint(1, 30), temperature=rng.choice([0, 1.0]),
                             stop=rng.choice([[], ["e"]])) for _ in prompts]
    outputs = llm.generate(prompts, params)
    assert all(o.finished for o in outputs)
    assert llm.engine.scheduler.stats.num_preemptions > 0   # the pool was tight on purpose
    assert_no_leak(llm)


def test_aborted_requests_free_their_blocks(llama_dir):
    llm = LLM(str(llama_dir), block_size=8)
    engine = llm.engine
    for i in range(4):
        engine.add_request(str(i), [1 + i] * 30, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    for i in range(4):
        assert engine.abort_request(str(i)).finish_reason == "abort"
    assert_no_leak(llm)


def test_prefix_cache_hits_match_the_shared_prefixes(llama_dir):
    block = 16
    llm = LLM(str(llama_dir), block_size=block)
    stats = llm.engine.scheduler.stats
    rng = random.Random(3)
    shared = [rng.randrange(300) for _ in range(3 * block + 5)]    # 3 full blocks + 5 tokens
    params = SamplingParams(max_tokens=2, temperature=0)
    llm.generate([shared + [1, 2, 3]], params)
    assert (stats.prefix_cache_hits, stats.prefix_cache_queries) == (0, len(shared) + 3)
    # Three prompts with the same 53-token prefix: each reuses the 3 full blocks (48 tokens) and no more.
    suffixes = [[4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [17] * 40]
    outputs = llm.generate([shared + s for s in suffixes], params)
    assert [o.num_cached_tokens for o in outputs] == [3 * block] * 3
    assert stats.prefix_cache_hits == 9 * block
    # A prompt of exactly 4 blocks seen before: its last block is recomputed to produce logits.
    exact = shared[:4 * block - 5] + [9] * 5
    llm.generate([exact], params)
    again = llm.generate([exact], params)
    assert again[0].num_cached_tokens == 3 * block
    assert_no_leak(llm)
