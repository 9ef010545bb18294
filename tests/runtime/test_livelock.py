"""No request can hold up the engine: every sequence fits the KV cache alone, and every workload finishes.

Before: a request that fit max_model_len but not the whole cache preempted itself forever, spinning the
engine and blocking every request behind it.
"""
import dataclasses
import random

import pytest

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams


def run_to_end(llm: LLM, max_steps: int) -> tuple[dict, int]:
    finals, steps = {}, 0
    while llm.engine.has_unfinished_requests():
        steps += 1
        assert steps <= max_steps, f"not finished after {max_steps} steps: {len(llm.engine.requests)} requests left"
        for output in llm.engine.step():
            if output.finished:
                finals[output.request_id] = output
    return finals, steps


def assert_no_block_leaks(llm: LLM) -> None:
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks and not any(manager.ref_counts)
    assert llm.engine.scheduler.num_unfinished == 0


def test_a_sequence_longer_than_the_cache_no_longer_blocks_the_queue(llama_dir, caplog):
    """The issue's repro: 2 blocks of 16 tokens, one request of 4 prompt + 40 output tokens, then another. The
    engine serves at most the 32 tokens the cache holds; the config it was given stays as it was (its limit and
    its device "auto", which the runner reads as the CPU)."""
    settings = {"num_kvcache_blocks": 2, "block_size": 16, "device": "auto"}   # read as cpu here, kept as "auto"
    with caplog.at_level("WARNING"):
        llm = LLM(str(llama_dir), **settings)
    assert "max_model_len lowered to 32" in caplog.text
    config = llm.engine.config
    assert dataclasses.asdict(config) == dataclasses.asdict(EngineConfig(str(llama_dir), **settings))
    assert config.max_model_len == 512   # the model's own limit, as validated
    assert config.device == "auto" and llm.engine.core.model_runner.device.type == "cpu"
    core = llm.engine.core
    assert core.model_runner.max_model_len == core.info.max_model_len == core.scheduler.max_model_len == 32
    assert core.block_manager.tables.shape[1] == core.model_runner.max_blocks_per_seq == 2
    with pytest.raises(InvalidRequestError, match="the prompt has 32 tokens; this model serves at most 32 tokens"):
        llm.engine.add_request("too long", list(range(1, 33)), SamplingParams(max_tokens=1))
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    llm.engine.add_request("long", [5, 6, 7, 8], params)
    llm.engine.add_request("other", [9, 10], SamplingParams(max_tokens=3, ignore_eos=True))
    finals, _ = run_to_end(llm, max_steps=200)
    assert finals["long"].finish_reason == "length" and len(finals["long"].token_ids) == 28
    assert finals["other"].finish_reason == "length" and len(finals["other"].token_ids) == 3
    assert_no_block_leaks(llm)


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_on_tiny_caches_all_finish(llama_dir, seed):
    """Random caches (2-12 blocks of 4-16 tokens), batch limits and requests (some longer than the cache,
    which are refused at once): every admitted request finishes, in bounded steps, and no block leaks."""
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    llm = LLM(str(llama_dir), num_kvcache_blocks=rng.randint(2, 12), block_size=block_size,
              max_num_seqs=rng.randint(1, 8), max_num_batched_tokens=rng.choice([8, 16, 64]),
              enable_prefix_caching=rng.random() < 0.7)
    cache_tokens = llm.engine.block_manager.num_blocks * block_size
    vocab = llm.engine.config.model_config.vocab_size
    admitted, refused, total_tokens = [], 0, 0
    shared = [rng.randrange(vocab) for _ in range(block_size * 2)]   # prefix-cache hits
    for i in range(rng.randint(5, 25)):
        length = rng.randint(1, cache_tokens + 8)
        prompt = (shared[:length] if rng.random() < 0.3 else []) + [rng.randrange(vocab) for _ in range(length)]
        prompt = prompt[:length]
        params = SamplingParams(max_tokens=rng.randint(1, cache_tokens), temperature=rng.choice([0, 1.0]),
                                seed=i, ignore_eos=True)
        try:
            llm.engine.add_request(f"r{i}", prompt, params)
        except InvalidRequestError:
            assert length >= llm.engine.core.info.max_model_len
            refused += 1
            continue
        admitted.append(f"r{i}")
        total_tokens += length + params.max_tokens
    # Generous bound: preemption recomputes, but nothing may spin.
    finals, steps = run_to_end(llm, max_steps=50 * (total_tokens + 10))
    assert sorted(finals) == sorted(admitted)
    for request_id in admitted:
        assert finals[request_id].finish_reason == "length"
    assert_no_block_leaks(llm)
