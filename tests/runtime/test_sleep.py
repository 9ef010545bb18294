"""Sleep and wake in the engine (runtime/engine/sleep.py): after a wake, at either level, the outputs are
transformers' and every weight byte is what it was; asleep, the weights hold no storage; the prefix cache is
forgotten with the KV cache's contents; the process's memory falls by the weights and the KV pages it had touched."""
import re
from pathlib import Path

import pytest

from kubeinfer.runtime.engine.sleep import WeightStash, weight_slots
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.models.weights import named_weights, tensor_of
from kubeinfer.runtime.sampling_params import SamplingParams
from support.reference import assert_same_outputs, hf_greedy
from support.weights import same_bytes, use_linear_layout, weights_of

PROMPTS = ["Kubernetes runs containers", "The key and value cache keeps the attention state of every token",
           "Numbers: 0 1 2 3 4 5"]
TOKENS = 8


def greedy(max_tokens=TOKENS):
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("arch, layout", [("llama", "auto"), ("qwen2", "auto"), ("llama", "onednn")])
def test_outputs_after_a_wake_are_transformers(model_dirs, arch, layout, level, monkeypatch):
    """An untied head and a tied one (a packed copy beside the plain); the CPU's own linear layout (panels where
    their kernel runs) and oneDNN's (opaque weights: their plain bytes go to the stash, packed again at wake)."""
    use_linear_layout(monkeypatch, layout)
    llm = LLM(str(model_dirs[arch]))
    if layout == "onednn":
        assert any(slot.opaque for slot in weight_slots([llm.engine.model_runner.model]))
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(model_dirs[arch], prompt_ids, TOKENS)
    assert_same_outputs(llm.generate(prompt_ids, greedy()), reference)
    weights = weights_of(llm)
    slept = llm.sleep(level)
    assert slept["level"] == level
    held = [attribute for _, _, attribute, value in named_weights(llm.engine.model_runner.model)
            if tensor_of(value).numel()]
    assert held == [], f"weights that kept their memory while asleep: {held}"
    outputs = llm.generate(prompt_ids, greedy())   # the requests wake it
    assert llm.engine.core.sleeping is None
    assert_same_outputs(outputs, reference)
    assert [o.num_cached_tokens for o in outputs] == [0] * len(PROMPTS), "a prefix served from a freed cache"
    assert same_bytes(weights_of(llm), weights)


def test_a_moe_model_wakes_from_level_two_with_its_expert_counts(moe_dirs):
    """The experts' grouped weights are built again; the routed-token counters (metrics since start) are kept."""
    llm = LLM(str(moe_dirs["qwen3moe"]))
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(moe_dirs["qwen3moe"], prompt_ids, TOKENS)
    llm.generate(prompt_ids, greedy())
    routed = llm.engine.model_runner.expert_load()
    llm.sleep(2)
    assert llm.engine.model_runner.expert_load() == routed
    assert_same_outputs(llm.generate(prompt_ids, greedy()), reference)


def test_sleeping_twice_deepens_and_waking_an_awake_engine_does_nothing(llama_dir):
    llm = LLM(str(llama_dir))
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(llama_dir, prompt_ids, TOKENS)
    assert llm.wake_up()["level"] == 0
    assert llm.sleep(1)["level"] == 1
    assert llm.sleep(1)["level"] == 1
    assert llm.sleep(2)["level"] == 2
    assert llm.sleep(1)["level"] == 2, "a lighter sleep than the engine's own woke some of it"
    assert llm.engine.core.sleeping.stash is None, "level 2 kept level 1's copy of the weights"
    assert llm.wake_up()["level"] == 2
    assert_same_outputs(llm.generate(prompt_ids, greedy()), reference)


def test_a_second_level_one_sleep_takes_the_file_kept_since_the_first_and_writes_nothing(llama_dir, monkeypatch):
    llm = LLM(str(llama_dir))
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(llama_dir, prompt_ids, TOKENS)
    weights = weights_of(llm)
    llm.sleep(1)
    first = llm.engine.core.sleeping.stash
    assert llm.wake_up()["level"] == 1
    monkeypatch.setattr(WeightStash, "__init__", lambda *_: pytest.fail("a second sleep wrote the weights again"))
    llm.sleep(1)
    assert llm.engine.core.sleeping.stash is first
    assert_same_outputs(llm.generate(prompt_ids, greedy()), reference)   # woken from the kept file
    assert same_bytes(weights_of(llm), weights)
    llm.sleep(2)   # level 2 drops the file with the weights
    assert llm.engine.core.sleeping.stash is None and first.file is None


@pytest.mark.parametrize("wake", ["map", "copy"])
def test_a_level_one_wake_maps_the_file_or_copies_it_when_asked(llama_dir, monkeypatch, tmp_path, wake):
    """By default the weights come back as views of a mapping of the sleep file (no copy); KUBEINFER_SLEEP_WAKE=copy
    copies them into new memory. Either way: the same bytes, transformers' outputs."""
    monkeypatch.setenv("KUBEINFER_SLEEP_WAKE", wake)
    monkeypatch.setenv("KUBEINFER_SLEEP_DIR", str(tmp_path))
    llm = LLM(str(llama_dir))
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    weights = weights_of(llm)
    llm.sleep(1)
    llm.wake_up()
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if f"{tmp_path}/#" in line]
    assert bool(mapped) == (wake == "map"), mapped   # O_TMPFILE: "DIR/#inode (deleted)"
    assert same_bytes(weights_of(llm), weights)
    assert_same_outputs(llm.generate(prompt_ids, greedy()), hf_greedy(llama_dir, prompt_ids, TOKENS))


def test_bad_levels_and_a_busy_engine_are_refused(llama_dir):
    llm = LLM(str(llama_dir))
    for level in (0, 3, "1"):
        with pytest.raises(InvalidRequestError, match="level must be 1 or 2"):
            llm.sleep(level)
    llm.engine.add_request("busy", PROMPTS[0], greedy())
    with pytest.raises(InvalidRequestError, match="requests in flight"):
        llm.sleep(1)
    assert llm.engine.core.sleeping is None


def rss_bytes() -> int:
    return int(re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)[1]) * 1024


@pytest.mark.parametrize("level", [1, 2])
def test_the_process_gives_back_the_weights_and_the_touched_kv_cache(tmp_path, level, monkeypatch):
    """A model of 70 MB (random weights, hidden 512, 4 layers) with 3,000 KV tokens written: asleep, the process's
    resident memory falls by at least 90% of the weights and pages written; awake and serving again, it comes back."""
    from kubeinfer.runtime.demo import train_tokenizer, write_llama_model
    monkeypatch.setenv("KUBEINFER_SLEEP_DIR", str(tmp_path))
    write_llama_model(tmp_path / "model", train_tokenizer(384), hidden_size=512, intermediate_size=2048,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8)
    llm = LLM(str(tmp_path / "model"), max_model_len=1024, kv_cache_memory_gib=0.25)
    runner = llm.engine.model_runner
    llm.generate([[5] * 1000] * 3, greedy(max_tokens=1))
    touched = 3 * 1000 * 2 * 4 * 512 * 4   # tokens x (K, V) x layers x hidden x fp32
    weights = sum(s.nbytes for s in weight_slots([runner.model]))
    awake = rss_bytes()
    slept = llm.sleep(level)
    asleep = rss_bytes()
    assert awake - asleep >= 0.9 * (weights + touched), (awake, asleep, weights, touched)
    assert abs(slept["freed_bytes"] - (awake - asleep)) < 0.05 * (weights + touched)
    llm.generate([[5] * 1000] * 3, greedy(max_tokens=1))
    assert rss_bytes() - asleep >= 0.9 * (weights + touched)
    if level == 1:   # woken onto a mapping of the file: a second sleep gives its pages back too (no view kept it)
        again = rss_bytes()
        llm.sleep(1)
        assert again - rss_bytes() >= 0.9 * (weights + touched), (again, rss_bytes(), weights, touched)
