"""Stop strings, stop ids, EOS, and streamed text that never splits a character."""
import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.tokenizer import MAX_INCOMPLETE_CHARS, IncrementalDetokenizer

GREEDY = dict(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir))


def stream(llm: LLM, prompt: str, params: SamplingParams):
    llm.engine.add_request("s", prompt, params)
    deltas, final = [], None
    while llm.engine.has_unfinished_requests():
        for output in llm.engine.step():
            deltas.append(output.new_text)
            final = output
    return deltas, final


def test_stop_string_cuts_the_text_and_streaming_agrees(llm):
    [full] = llm.generate("Kubernetes runs", SamplingParams(**GREEDY))
    assert len(full.text) > 8
    stop = full.text[5:8]
    index = full.text.find(stop)
    deltas, final = stream(llm, "Kubernetes runs", SamplingParams(**GREEDY, stop=["@@never@@", stop]))
    assert final.text == full.text[:index] == "".join(deltas)
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_stop_token_id_and_eos(llm):
    [full] = llm.generate("Kubernetes runs", SamplingParams(**GREEDY))
    stop_id = full.token_ids[3]
    [stopped] = llm.generate("Kubernetes runs", SamplingParams(**GREEDY, stop_token_ids=[stop_id]))
    first = full.token_ids.index(stop_id)
    assert stopped.token_ids == full.token_ids[:first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id
    # The same token as EOS, honoured unless ignore_eos.
    llm.engine.scheduler.eos_token_ids = frozenset([stop_id])
    try:
        [eos] = llm.generate("Kubernetes runs", SamplingParams(max_tokens=24, temperature=0))
        [ignored] = llm.generate("Kubernetes runs", SamplingParams(**GREEDY))
    finally:
        llm.engine.scheduler.eos_token_ids = frozenset(llm.engine.eos_token_ids)
    assert eos.token_ids == full.token_ids[:first + 1] and eos.stop_reason is None
    assert ignored.token_ids == full.token_ids


def test_streamed_text_never_splits_a_multibyte_character(llm):
    tokenizer = llm.tokenizer
    text = "naïve café 日本語のテキスト 🙂🚀 кириллица"
    ids = tokenizer.encode(text)
    byte_tokens = [t for t in ids if "\ufffd" in tokenizer.decode([t])]
    assert byte_tokens, "the tokenizer should split some characters across tokens"
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    deltas = [detokenizer.step(ids[:i + 1]) for i in range(len(ids))]
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) + detokenizer.flush(ids) == text


def test_invalid_bytes_stream_as_they_come_instead_of_being_held_to_the_end(llm):
    """A random-weight model writes bytes that are no UTF-8 at all: they stream as U+FFFD right away (only a
    possibly incomplete tail waits), and the deltas still add up to the decoded text."""
    tokenizer = llm.tokenizer
    lone = [t for t in range(tokenizer.vocab_size) if tokenizer.decode([t]) == "\ufffd"
            and tokenizer.decode([t, t]) == "\ufffd\ufffd"]   # a byte that never starts a character
    assert lone, "the byte-level tokenizer has continuation-byte tokens"
    words = tokenizer.encode(" cluster", add_special_tokens=False)
    ids = words + [lone[0]] * 12 + words
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    deltas = [detokenizer.step(ids[:i + 1]) for i in range(len(ids))]
    held_to = len(words) + MAX_INCOMPLETE_CHARS + 1
    assert "".join(deltas[:held_to]).count("\ufffd") >= 1, deltas
    assert "".join(deltas[:len(words) + 12]).count("\ufffd") == 12 - MAX_INCOMPLETE_CHARS
    assert "".join(deltas) + detokenizer.flush(ids) == tokenizer.decode(ids)


def test_generation_stream_equals_final_text(llm):
    deltas, final = stream(llm, "日本語", SamplingParams(**GREEDY))
    assert "".join(deltas) == final.text == llm.tokenizer.decode(final.token_ids)
