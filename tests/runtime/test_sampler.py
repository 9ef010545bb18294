"""The sampler's filters, penalties and draws, against straightforward references."""
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.layers.sampler import Sampler, _top_k_top_p
from kubeinfer.runtime.sampling_params import SamplingParams

EOS = 0


def seqs(n: int, params: SamplingParams, prompt=(1, 2), output=()) -> list[Sequence]:
    result = []
    for i in range(n):
        seq = Sequence(str(i), list(prompt), params)
        for token in output:
            seq.append_token(token)
        result.append(seq)
    return result


def reference_filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Probabilities left after the filters, computed token by token: top-k, then top-p over the
    renormalised top-k distribution (transformers' order), then min-p."""
    order = logits.argsort(descending=True).tolist()
    if top_k != -1:
        order = order[:top_k]
    probs = torch.zeros_like(logits)
    probs[order] = torch.softmax(logits[order], -1)
    keep, mass = [], 0.0
    for token in order:
        if mass >= top_p:
            break
        keep.append(token)
        mass += probs[token].item()
    kept = torch.zeros_like(probs)
    kept[keep] = torch.softmax(logits[keep], -1)
    if min_p:
        kept[kept < min_p * kept.max()] = 0
    return kept / kept.sum()


@pytest.mark.parametrize("top_k, top_p, min_p", [(-1, 1.0, 0.0), (3, 1.0, 0.0), (-1, 0.7, 0.0), (4, 0.8, 0.0),
                                                 (-1, 1.0, 0.3), (1, 1.0, 0.0)])
def test_draws_follow_the_filtered_distribution(top_k, top_p, min_p):
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    expected = reference_filter(logits, top_k, top_p, min_p)
    n = 40000
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    tokens, _ = Sampler(())(logits.expand(n, -1), seqs(n, params))
    frequencies = torch.bincount(torch.tensor(tokens), minlength=8).float() / n
    assert (frequencies[expected == 0] == 0).all()
    torch.testing.assert_close(frequencies, expected, atol=0.012, rtol=0)


def test_temperature_sharpens_and_greedy_takes_the_argmax():
    torch.manual_seed(0)
    logits = torch.tensor([1.0, 0.5, 0.0])
    n = 30000
    tokens, _ = Sampler(())(logits.expand(n, -1), seqs(n, SamplingParams(temperature=0.5)))
    frequencies = torch.bincount(torch.tensor(tokens), minlength=3).float() / n
    torch.testing.assert_close(frequencies, torch.softmax(logits / 0.5, -1), atol=0.012, rtol=0)
    tokens, _ = Sampler(())(torch.tensor([[0.1, 0.9, 0.3]]), seqs(1, SamplingParams(temperature=0)))
    assert tokens == [1]


def test_top_k_top_p_mask_matches_reference():
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    top_k, top_p = [-1, 5, 1, 50, 10, -1], [0.5, 1.0, 1.0, 0.9, 0.3, 1.0]
    masked = _top_k_top_p(logits, top_k, top_p)
    for row in range(6):
        expected = reference_filter(logits[row], top_k[row], top_p[row], 0.0) > 0
        assert torch.equal(torch.isfinite(masked[row]), expected)


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(2)
    logits = torch.randn(1, 20)
    seq = seqs(1, SamplingParams(temperature=0, repetition_penalty=1.7), prompt=(3, 4, 5), output=(5, 9))[0]
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([seq.token_ids]), logits.clone())
    from kubeinfer.runtime.layers.sampler import _apply_penalties
    ours = logits.clone()
    _apply_penalties(ours[0], seq)
    torch.testing.assert_close(ours, expected)


def test_presence_and_frequency_penalties_count_output_tokens_only():
    from kubeinfer.runtime.layers.sampler import _apply_penalties
    logits = torch.zeros(10)
    seq = seqs(1, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt=(1, 2), output=(2, 7, 7))[0]
    _apply_penalties(logits, seq)
    expected = torch.zeros(10)
    expected[2] = -(0.5 + 0.25)
    expected[7] = -(0.5 + 2 * 0.25)
    torch.testing.assert_close(logits, expected)


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.tensor([[10.0, 0.0, 9.0, 1.0]])
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[2])
    tokens, _ = Sampler((EOS,))(logits, seqs(1, params))
    assert tokens == [3]
    tokens, _ = Sampler((EOS,))(logits, seqs(1, params, output=(3, 3)))   # min_tokens reached
    assert tokens == [EOS]


def test_the_callers_logits_stay_as_they_were_edited_rows_or_not():
    """Logits are copied only when a row edits them (min_tokens, penalties, logit_bias, a grammar): either way the
    tensor the runner passed is left as it was, and the edits reach only their own row."""
    logits = torch.tensor([[10.0, 0.0, 9.0, 1.0], [10.0, 0.0, 9.0, 1.0]])
    before = logits.clone()
    tokens, _ = Sampler((EOS,))(logits, seqs(2, SamplingParams(temperature=0)))
    assert tokens == [0, 0] and torch.equal(logits, before)
    biased = seqs(1, SamplingParams(temperature=0, logit_bias={2: 5.0})) + seqs(1, SamplingParams(temperature=0))
    tokens, _ = Sampler((EOS,))(logits, biased)
    assert tokens == [2, 0] and torch.equal(logits, before)


def test_seeded_draws_do_not_depend_on_the_batch():
    torch.manual_seed(3)
    logits = torch.randn(5, 100)
    params = SamplingParams(temperature=1.0, seed=42)
    alone = [Sampler(())(logits[2:3], seqs(1, params))[0][0] for _ in range(3)]
    in_batch = Sampler(())(logits, seqs(5, params))[0][2]
    assert in_batch == alone[0] == alone[1]


def test_logprobs_are_the_raw_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    _, [lp] = Sampler(())(logits, seqs(1, SamplingParams(temperature=0, logprobs=2, repetition_penalty=2.0)))
    expected = torch.log_softmax(logits[0], -1)
    assert lp.token_id == 0 and lp.logprob == pytest.approx(expected[0].item())
    assert [t for t, _ in lp.top] == [0, 1]
    assert [v for _, v in lp.top] == pytest.approx(expected[:2].tolist())
