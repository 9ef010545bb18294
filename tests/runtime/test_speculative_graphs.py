"""Speculative steps over the fixed shapes of CUDA graphs: each chunk padded to q = k + 1 tokens (`chunk_padding`).

On the CPU nothing is captured, and the graphs' static buffers run the same padded forward eagerly: the greedy
tokens and logprobs must be those of plain decoding, through verify steps and the draft model's forwards. On a GPU
(`-m gpu`) the same comparison runs with the graphs captured and replayed (tests/runtime/test_gpu.py)."""
import pytest
import torch

from kubeinfer.runtime.engine.chunk_padding import pad_chunks
from kubeinfer.runtime.engine.cuda_graphs import step_graphs
from kubeinfer.runtime.sampling_params import SamplingParams
from support.blocks import assert_no_leak
from support.speculative import LLM_VOCAB, assert_same, generate, repetitive_prompts


def test_chunks_are_padded_at_their_end_and_keep_their_positions():
    padded = pad_chunks(input_ids=torch.tensor([10, 20, 21, 22, 30, 31]),
                        positions=torch.tensor([4, 9, 10, 11, 1, 2]),
                        cu_seqlens_q=torch.tensor([0, 1, 4, 6], dtype=torch.int32),
                        seq_lens=torch.tensor([5, 12, 3], dtype=torch.int32),
                        slot_mapping=torch.tensor([104, 209, 210, 211, 301, 302]), q=4, max_position=12)
    assert padded.rows.tolist() == [0, 4, 5, 6, 8, 9]
    assert padded.input_ids.tolist() == [10, 0, 0, 0, 20, 21, 22, 0, 30, 31, 0, 0]
    assert padded.slot_mapping.tolist() == [104, -1, -1, -1, 209, 210, 211, -1, 301, 302, -1, -1]
    # each chunk starts where it did and runs on to start + q; padding positions are capped, real ones never
    assert padded.positions.tolist() == [4, 5, 6, 7, 9, 10, 11, 12, 1, 2, 3, 4]
    assert padded.seq_lens.tolist() == [8, 13, 5]
    assert padded.seq_lens.dtype == torch.int32


def test_a_chunk_longer_than_q_is_refused():
    with pytest.raises(AssertionError, match="does not fit"):
        pad_chunks(torch.arange(5), torch.arange(5), torch.tensor([0, 5], dtype=torch.int32),
                   torch.tensor([5], dtype=torch.int32), torch.arange(5), q=4, max_position=10)


def _with_padded_steps(llm):
    """Gives the engine the speculative graphs' static buffers, uncaptured: every step that fits runs padded."""
    runner, config = llm.engine.model_runner, llm.engine.config
    q, dtype, device = config.speculative_tokens + 1, runner.dtype, runner.device
    limit = runner.max_model_len
    runner.verify_graphs = step_graphs(config, limit, runner.model, config.model_config.hidden_size, dtype, device, q)
    if runner.draft is not None:
        hidden = config.draft_model_config.hidden_size
        runner.draft.graphs = step_graphs(config, limit, runner.draft.model, hidden, dtype, device)
        runner.draft.chunk_graphs = step_graphs(config, limit, runner.draft.model, hidden, dtype, device, q)
    return llm


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_padded_speculative_steps_give_plain_greedy_output(llama_dir, method):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, logprobs=3)
    prompts = repetitive_prompts(7, LLM_VOCAB)
    _, plain = generate(llama_dir, prompts, params)
    settings = {"speculative_method": method, "speculative_ngram_min": 1}
    if method == "draft":
        settings = {"speculative_method": method, "speculative_model": str(llama_dir)}
    llm = generate(llama_dir, prompts[:1], SamplingParams(max_tokens=1), **settings)[0]   # built, then padded
    _with_padded_steps(llm)
    ours = llm.generate(prompts, params)
    assert_same(ours, plain)
    runner = llm.engine.model_runner
    assert runner.verify_graphs.num_replays > 0 and llm.engine.scheduler.stats.num_accepted_tokens > 0
    if method == "draft":
        assert runner.draft.graphs.num_replays > 0 and runner.draft.chunk_graphs.num_replays > 0
    assert_no_leak(llm)


@pytest.mark.parametrize("method", [None, "ngram", "draft"])
def test_the_engine_captures_the_graph_sets_its_method_needs(llama_dir, method, monkeypatch):
    """Decode graphs always; verify graphs of k + 1 tokens with speculation; the draft's own two sets with a draft
    model (capture itself needs CUDA: here it records what would be captured)."""
    from kubeinfer.runtime.engine import cuda_graphs
    captured = []
    monkeypatch.setattr(cuda_graphs.DecodeGraphs, "capture", lambda graphs: captured.append(graphs))
    settings = {"speculative_method": method, "speculative_tokens": 3} if method else {}
    if method == "draft":
        settings["speculative_model"] = str(llama_dir)
    llm = generate(llama_dir, [[1, 2, 3]], SamplingParams(max_tokens=1), **settings)[0]
    runner = llm.engine.model_runner
    decode, verify = cuda_graphs.capture_engine_graphs(llm.engine.config, runner.max_model_len, runner.model,
                                                       runner.draft, runner.dtype, runner.device)
    assert decode.tokens_per_seq == 1 and (verify is None) == (method is None)
    expected = [decode] + ([verify] if verify else [])
    if method == "draft":
        assert (runner.draft.graphs.tokens_per_seq, runner.draft.chunk_graphs.tokens_per_seq) == (1, 4)
        assert runner.draft.graphs.model is runner.draft.model
        expected += [runner.draft.graphs, runner.draft.chunk_graphs]
    assert captured == expected and (verify is None or verify.tokens_per_seq == 4)
