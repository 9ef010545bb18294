"""Disaggregated greedy output is the colocated output, token for token: the prefill replica computes the prompt (in
chunks, some from its prefix cache) and the first token, the decode replica pulls the KV and decodes, also when it
preempts and recomputes, and when it speculates."""
import random

import pytest

from kubeinfer.runtime.sampling_params import SamplingParams
from support.blocks import assert_no_leak
from support.disagg import engine, generate_remote, kv_address, prefill_replica, pull_in_step, wait_until_drained
from support.models import perturbed_copy

BLOCK = 8
IDLE_S = 2.0
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
pytestmark = pytest.mark.timeout(120)


def mixed_prompts(seed: int, count: int, vocab: int = 300) -> list[list[int]]:
    """Lengths on and off block edges (1 token, exactly 2 blocks, long enough to be chunked)."""
    rng = random.Random(seed)
    lengths = [1, 2 * BLOCK, 2 * BLOCK + 1, 61, 97] + [rng.randint(3, 120) for _ in range(count - 5)]
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths[:count]]


def colocated(model_dir, prompts, params, **settings) -> list[list[int]]:
    llm = engine(model_dir, block_size=BLOCK, **settings)
    return [output.token_ids for output in llm.generate(prompts, params)]


def assert_same_tokens(finals: dict, reference: list[list[int]]) -> None:
    assert sorted(finals) == sorted(str(i) for i in range(len(reference)))
    for index, tokens in enumerate(reference):
        output = finals[str(index)]
        assert output.error is None
        assert output.token_ids == tokens, f"request {index} differs"


# 1 block in flight (backpressure at every block) with the slow tests; the transport's own backpressure test, at 2,
# is in the default run (tests/runtime/disagg/test_tcp_transport.py)
@pytest.mark.parametrize("blocks_in_flight", [16, pytest.param(1, marks=pytest.mark.slow)])
def test_disaggregated_equals_colocated_through_chunked_prefill(llama_dir, blocks_in_flight):
    """With one block in flight per stream, the prefill replica's blocks wait in its cache for room (backpressure)."""
    prompts = mixed_prompts(1, 10)
    reference = colocated(llama_dir, prompts, GREEDY)
    with prefill_replica(llama_dir, block_size=BLOCK, max_num_batched_tokens=24, kv_idle_timeout_s=IDLE_S) as prefill:
        prefill.engine.core.kv_exporter.source.max_blocks_in_flight = blocks_in_flight
        decode = engine(llama_dir, block_size=BLOCK, kv_role="decode", kv_idle_timeout_s=IDLE_S)
        finals = generate_remote(decode, prompts, GREEDY, kv_address(prefill))
        wait_until_drained(prefill, IDLE_S)
        assert_same_tokens(finals, reference)
        assert decode.engine.core.kv_importer.num_transferred == len(prompts)
        assert_no_leak(decode)
        assert_no_leak(prefill)


def test_prefix_cache_hits_on_both_sides_are_not_recomputed_nor_resent(llama_dir):
    rng = random.Random(2)
    shared = [rng.randrange(1, 300) for _ in range(5 * BLOCK + 3)]
    prompts = [shared + [rng.randrange(1, 300) for _ in range(n)] for n in (1, 9, 30)]
    reference = colocated(llama_dir, prompts, GREEDY)
    with prefill_replica(llama_dir, block_size=BLOCK, kv_idle_timeout_s=IDLE_S) as prefill:
        decode = engine(llama_dir, block_size=BLOCK, kv_role="decode", kv_idle_timeout_s=IDLE_S)
        importer = decode.engine.core.kv_importer
        first = generate_remote(decode, prompts[:1], GREEDY, kv_address(prefill))
        assert importer.num_blocks_reused == 0
        # The prefill replica then has the shared prefix cached; so has the decode replica (from the first pull).
        finals = generate_remote(decode, prompts, GREEDY, kv_address(prefill))
        wait_until_drained(prefill, IDLE_S)
        assert first["0"].token_ids == reference[0]
        assert_same_tokens(finals, reference)
        assert prefill.engine.scheduler.stats.prefix_cache_hits >= 3 * 5 * BLOCK
        assert importer.num_blocks_reused >= 3 * 5    # the five shared full blocks, not pulled again
        assert [finals[str(i)].num_cached_tokens for i in range(3)] == [5 * BLOCK] * 3
        assert_no_leak(decode)
        assert_no_leak(prefill)


def test_preemption_on_the_decode_side_recomputes_to_the_same_tokens(llama_dir):
    prompts = mixed_prompts(3, 6)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    reference = colocated(llama_dir, prompts, params)
    with prefill_replica(llama_dir, block_size=BLOCK, kv_idle_timeout_s=IDLE_S) as prefill:
        decode = engine(llama_dir, block_size=BLOCK, num_kvcache_blocks=30, kv_role="decode",
                     kv_idle_timeout_s=IDLE_S)
        finals = generate_remote(decode, prompts, params, kv_address(prefill))
        wait_until_drained(prefill, IDLE_S)
        assert_same_tokens(finals, reference)
        assert decode.engine.scheduler.stats.num_preemptions > 0   # the pool was tight on purpose
        assert_no_leak(decode)
        assert_no_leak(prefill)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_prefill_request_preempted_mid_prompt_still_sends_the_right_blocks(llama_dir, prefix_caching):
    """Both engines stepped here, in turn; the prefill request is preempted after two chunks, then recomputed from
    its cached blocks (or from scratch, with the prefix cache off) while its stream holds what it sent."""
    prompt = mixed_prompts(5, 5)[-1]   # 97 tokens: 12 full blocks and a partial one
    reference = colocated(llama_dir, [prompt], GREEDY)
    prefill, decode = pull_in_step(llama_dir, prompt, GREEDY, BLOCK, IDLE_S, enable_prefix_caching=prefix_caching)
    prefill.engine.step()
    prefill.engine.step()
    scheduler = prefill.engine.scheduler
    (seq,) = scheduler.running
    assert 0 < seq.num_computed_tokens < len(prompt)
    scheduler.running.remove(seq)
    scheduler._preempt(seq)
    finals = {}
    while decode.engine.has_unfinished_requests() or prefill.engine.has_unfinished_requests():
        prefill.engine.step()
        finals.update((o.request_id, o) for o in decode.engine.step() if o.finished)
    assert_same_tokens(finals, reference)
    assert scheduler.stats.num_preemptions == 1
    assert_no_leak(decode)
    assert_no_leak(prefill)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_decoding_on_the_decode_side_keeps_the_tokens(llama_dir, tmp_path, method):
    rng = random.Random(4)
    passage = [rng.randrange(1, 300) for _ in range(17)]
    prompts = [passage * 3, passage[:5] * 6 + [3], [rng.randrange(1, 300) for _ in range(40)]]
    reference = colocated(llama_dir, prompts, GREEDY)
    draft = {"speculative_model": str(perturbed_copy(llama_dir, tmp_path / "draft", noise=0.5))} \
        if method == "draft" else {}
    with prefill_replica(llama_dir, block_size=BLOCK, kv_idle_timeout_s=IDLE_S) as prefill:
        decode = engine(llama_dir, block_size=BLOCK, speculative_method=method, kv_role="decode",
                     kv_idle_timeout_s=IDLE_S, **draft)
        finals = generate_remote(decode, prompts, GREEDY, kv_address(prefill))
        wait_until_drained(prefill, IDLE_S)
        assert_same_tokens(finals, reference)
        assert decode.engine.scheduler.stats.num_accepted_tokens > 0   # drafts were proposed and kept
        assert_no_leak(decode)
        assert_no_leak(prefill)
