"""Speculative decoding, by prompt lookup and by a draft model: greedy output is plain greedy output, token for
token, on every architecture and through chunked prefill, prefix caching, preemption, aborts, stops and
logprobs; seeded sampling stays reproducible and batch-independent; no KV block is lost."""
import json

import pytest

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.ngram_proposer import propose_ngram
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.blocks import assert_no_leak
from support.models import perturbed_copy
from support.speculative import LLM_VOCAB, assert_same, generate, repetitive_prompts

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]
TIED = {"llama3", "qwen2"}   # tied input and output embeddings


# -- the proposer ----------------------------------------------------------------------------------------------
def test_the_longest_suffix_and_its_latest_occurrence_win():
    #            0  1  2  3  4  5  6  7  8  9 10 11 12
    context = [1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3, 4, 2, 3]
    # suffix (2, 3): latest earlier occurrence at 9..10 -> 4, 2, 3, ...; the 3-gram (4, 2, 3) has no match
    assert propose_ngram(context, 3, 2, 4) == [4, 2, 3]
    # with n = 3 allowed only: no earlier (4, 2, 3)
    assert propose_ngram(context, 3, 3, 4) == []
    # (1, 2, 3) beats (2, 3): the 3-gram's latest match at 0..2 is followed by 9, 2, 3
    assert propose_ngram([1, 2, 3, 9, 2, 3, 5, 1, 2, 3], 3, 2, 4) == [9, 2, 3]


def test_a_loop_is_proposed_in_full_by_reading_on_into_the_copy():
    assert propose_ngram([5, 6, 7, 6, 7], 5, 2, 2) == [6, 7, 6, 7, 6]
    assert propose_ngram([4, 4, 4], 3, 1, 3) == [4, 4, 4]


def test_no_proposal_without_an_earlier_match_nor_from_bytes_straddling_two_ids():
    assert propose_ngram([1, 2, 3, 4], 4, 1, 3) == []
    assert propose_ngram([7], 4, 1, 3) == []
    # 256 packs as 00 01 00 00; followed by 0 the bytes 01 00 00 00 (= the id 1) appear at an odd offset.
    assert propose_ngram([256, 0, 5, 1], 2, 1, 1) == []
    assert propose_ngram([256, 0, 1, 5, 1], 2, 1, 1) == [5, 1]


def test_bad_speculative_settings_are_refused_in_one_line(llama_dir):
    with pytest.raises(ConfigError, match="speculative_method must be one of ngram"):
        EngineConfig(model=str(llama_dir), speculative_method="eagle")
    with pytest.raises(ConfigError, match="speculative_tokens must be >= 1"):
        EngineConfig(model=str(llama_dir), speculative_method="ngram", speculative_tokens=0)
    with pytest.raises(ConfigError, match="1 <= min <= max"):
        EngineConfig(model=str(llama_dir), speculative_method="ngram", speculative_ngram_min=3,
                     speculative_ngram_max=2)
    assert EngineConfig(model=str(llama_dir), speculative_method="none").speculative_method is None


# -- greedy: the same tokens as plain decoding -----------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_speculation_gives_plain_greedy_output(model_dirs, arch):
    model_dir = model_dirs[arch]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=3)
    prompts = repetitive_prompts(1, LLM_VOCAB, every_token=True)
    _, plain = generate(model_dir, prompts, params)
    # Lookups of single tokens too, so that the prompt holding every token yields wrong proposals.
    llm, ours = generate(model_dir, prompts, params, speculative_method="ngram", speculative_ngram_min=1)
    assert_same(ours, plain)
    stats = llm.engine.scheduler.stats
    assert stats.num_accepted_tokens > 0
    if arch not in TIED:   # drafts rejected too (a tied random model repeats its last token: always proposed)
        assert stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.prefix_cache_hits > 0                # the shared prefix was served from the cache
    assert stats.accepted_per_position[0] >= stats.accepted_per_position[-1]
    assert_no_leak(llm)


def test_greedy_speculation_through_preemption_and_a_tight_pool(llama_dir):
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    prompts = repetitive_prompts(2, LLM_VOCAB) * 2
    _, plain = generate(llama_dir, prompts, params)
    llm, ours = generate(llama_dir, prompts, params, speculative_method="ngram", num_kvcache_blocks=40,
                         speculative_tokens=6)
    assert [o.token_ids for o in ours] == [o.token_ids for o in plain]
    stats = llm.engine.scheduler.stats
    assert stats.num_preemptions > 0 and stats.num_accepted_tokens > 0
    assert_no_leak(llm)


def test_stops_and_limits_end_speculative_output_where_plain_output_ends(llama_dir):
    prompts = repetitive_prompts(3, LLM_VOCAB)
    free = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    _, unstopped = generate(llama_dir, prompts, free)
    # A stop id and a stop string taken from the middle of each plain output, so they can fall inside an
    # accepted run of drafts; and a max_tokens shorter than one step's drafts.
    for output in unstopped:
        stop_id = output.token_ids[5]
        stop_text = output.text[len(output.text) // 2:][:2]
        for params in (SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop_token_ids=[stop_id]),
                       SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=[stop_text]),
                       SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)):
            _, plain = generate(llama_dir, [output.prompt_token_ids], params)
            llm, ours = generate(llama_dir, [output.prompt_token_ids], params, speculative_method="ngram")
            assert_same(ours, plain)
            assert_no_leak(llm)


def test_aborts_with_drafts_in_flight_leave_no_block_behind(llama_dir):
    llm = LLM(str(llama_dir), block_size=8, speculative_method="ngram")
    engine = llm.engine
    for i, prompt in enumerate(repetitive_prompts(4, LLM_VOCAB)):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=200, ignore_eos=True, temperature=0))
    for _ in range(6):
        engine.step()
    assert engine.scheduler.stats.num_draft_tokens > 0
    for i in range(6):
        engine.abort_request(str(i))
    assert_no_leak(llm)


# -- sampling: reproducible, batch-independent ---------------------------------------------------------------
def test_a_seeded_request_gives_the_same_tokens_alone_or_in_any_batch(llama_dir):
    prompts = repetitive_prompts(5, LLM_VOCAB)
    # A low temperature: the random model's flat distributions sharpen enough for its output to repeat.
    seeded = SamplingParams(max_tokens=40, temperature=0.05, top_k=20, seed=11, ignore_eos=True)
    others = SamplingParams(max_tokens=25, temperature=1.0, ignore_eos=True)
    settings = {"speculative_method": "ngram", "speculative_ngram_min": 1}
    llm, alone = generate(llama_dir, [prompts[0]], seeded, **settings)
    stats = llm.engine.scheduler.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    _, together = generate(llama_dir, prompts, [seeded] + [others] * (len(prompts) - 1), **settings)
    assert together[0].token_ids == alone[0].token_ids
    _, again = generate(llama_dir, [prompts[0]], seeded, **settings)
    assert again[0].token_ids == alone[0].token_ids


# -- a draft model ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_a_draft_model_gives_plain_greedy_output(model_dirs, arch, tmp_path):
    """The target with noisy weights drafts: it often agrees and sometimes not, so acceptance and rejection
    both run; the output is the target's plain greedy output all the same."""
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, logprobs=3)
    prompts = repetitive_prompts(7, LLM_VOCAB)
    _, plain = generate(model_dirs[arch], prompts, params)
    draft = perturbed_copy(model_dirs[arch], tmp_path / "draft", noise=0.5)
    llm, ours = generate(model_dirs[arch], prompts, params, speculative_method="draft", speculative_model=str(draft))
    assert_same(ours, plain)
    stats = llm.engine.scheduler.stats
    assert stats.num_accepted_tokens > 0
    if arch not in TIED:   # a tied random model repeats its last token, which the draft always gets right
        assert stats.num_accepted_tokens < stats.num_draft_tokens
    assert_no_leak(llm)


def test_the_model_drafting_for_itself_is_accepted_and_survives_preemption(llama_dir):
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    prompts = repetitive_prompts(8, LLM_VOCAB) * 2
    _, plain = generate(llama_dir, prompts, params)
    llm, ours = generate(llama_dir, prompts, params, speculative_method="draft", speculative_model=str(llama_dir),
                         num_kvcache_blocks=40)
    assert [o.token_ids for o in ours] == [o.token_ids for o in plain]
    stats = llm.engine.scheduler.stats
    assert stats.num_preemptions > 0
    assert stats.num_accepted_tokens >= 0.95 * stats.num_draft_tokens > 0   # its own argmax, but for rounding
    assert_no_leak(llm)


def test_draft_model_settings_are_checked_in_one_line(llama_dir, tmp_path):
    with pytest.raises(ConfigError, match="needs speculative_model"):
        EngineConfig(model=str(llama_dir), speculative_method="draft")
    with pytest.raises(ConfigError, match="only used with speculative_method draft"):
        EngineConfig(model=str(llama_dir), speculative_method="ngram", speculative_model=str(llama_dir))
    with pytest.raises(ConfigError, match="does not exist"):
        EngineConfig(model=str(llama_dir), speculative_method="draft", speculative_model=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="a draft model runs in a single process only"):
        EngineConfig(model=str(llama_dir), speculative_method="draft", speculative_model=str(llama_dir),
                     tensor_parallel_size=2)
    other_vocab = tmp_path / "other"
    other_vocab.mkdir()
    config = json.loads((llama_dir / "config.json").read_text())
    (other_vocab / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    with pytest.raises(ConfigError, match="must share the model's tokenizer"):
        EngineConfig(model=str(llama_dir), speculative_method="draft", speculative_model=str(other_vocab))
