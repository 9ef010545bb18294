"""Speculative sampling keeps the target's distribution: chi-square tests of many seeded draws against the exact
distribution, on a tiny vocabulary.

Each test compares counts over a grid of outcomes with the exact probabilities (a Markov chain's, or the model's
own computed by transformers) and fails when the chi-square p-value is below ALPHA = 1e-3. Draws are seeded, so
the tests are deterministic; for a fresh set of seeds a correct sampler would fail each check with probability
0.1%. Each test also runs a control that must fail (draft tokens accepted without the test), so the check is
known to have the power to see a wrong sampler.
"""
import json

import pytest
import torch
import transformers as tf

from kubeinfer.runtime.demo import save_tokenizer, train_tokenizer
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.layers.sampler import Sampler
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.models import perturbed_copy

ALPHA = 1e-3
VOCAB = 6


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Goodness of fit of `counts` to `probs`; 0 when a draw landed on an outcome of probability 0. Outcomes
    expected fewer than `min_expected` times are pooled into one cell (the usual condition for the
    chi-square approximation; without it, many near-empty cells inflate the degrees of freedom)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs * counts.sum()
    rare = expected < min_expected
    observed = torch.cat([counts[~rare], counts[rare].sum().view(1)])
    expected = torch.cat([expected[~rare], expected[rare].sum().view(1)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = len(expected) - 1
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2).item()


def filtered(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The distribution plain sampling draws from (temperature, then top-k), row by row."""
    logits = logits / temperature
    if top_k != -1:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("temperature, top_k", [(1.0, -1), (0.7, 3)])
def test_verify_draws_a_markov_chain_with_its_own_distribution(temperature, top_k):
    """Tokens follow a Markov chain; each sequence brings two random drafts. The first two tokens out of a
    verify step (the second drawn by a plain step when only one came out) must follow the chain exactly."""
    torch.manual_seed(0)
    transitions = torch.randn(VOCAB, VOCAB) * 1.5            # logits of the next token given the last
    probs = filtered(transitions, temperature, top_k)
    n, last = 30000, 0
    params = SamplingParams(temperature=temperature, top_k=top_k, max_tokens=8)
    seqs = [Sequence(str(i), [last], params) for i in range(n)]
    drafts = torch.randint(0, VOCAB, (n, 2)).tolist()
    rows = torch.cat([transitions[[last, d[0], d[1]]] for d in drafts])
    tokens, _ = Sampler(()).verify(rows, seqs, drafts)
    first_two = _complete_pairs(tokens, transitions, seqs)
    exact = probs[last].unsqueeze(1) * probs                 # P(a) P(b | a)
    accepted = sum(len(t) - 1 for t in tokens)
    assert 0 < accepted < 2 * n                               # both acceptance and rejection happened
    p_value = chi_square_p_value(_pair_counts(first_two), exact)
    # Control: drafts taken without the acceptance test are visibly wrong.
    naive = [(d[0], d[1]) for d in drafts]
    naive_p = chi_square_p_value(_pair_counts(naive), exact)
    print(f"Markov chain, T {temperature}, top-k {top_k}: p {p_value:.3f}, {accepted / (2 * n):.1%} of drafts "
          f"accepted; control p {naive_p:.1e}")
    assert p_value > ALPHA
    assert naive_p < ALPHA


def _complete_pairs(tokens: list[list[int]], transitions: torch.Tensor, seqs: list[Sequence]):
    """The first two tokens of each sequence; where verify gave one, the second comes from a plain step."""
    short = [i for i, t in enumerate(tokens) if len(t) == 1]
    follow, _ = Sampler(())(transitions[[tokens[i][0] for i in short]], [seqs[i] for i in short])
    seconds = dict(zip(short, follow))
    return [(t[0], t[1] if len(t) > 1 else seconds[i]) for i, t in enumerate(tokens)]


def _pair_counts(pairs) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for a, b in pairs:
        counts[a, b] += 1
    return counts


# -- the whole engine, against the model's own distribution ---------------------------------------------------
MODEL_VOCAB = 8
PROMPT = [3, 1, 4, 1, 5, 2, 6, 0, 7, 3, 1, 4]   # every token appears, so single-token lookups always propose


@pytest.fixture(scope="module")
def tiny_vocab_model(tmp_path_factory):
    """A random Llama over 8 tokens, with an output layer scaled up so that its distributions are uneven."""
    path = tmp_path_factory.mktemp("tiny-vocab")
    config = tf.LlamaConfig(vocab_size=MODEL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(1)
    model = tf.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(60)
    model.save_pretrained(path)
    save_tokenizer(train_tokenizer(vocab_size=384), path)   # decodes ids 0-7; the model never emits more
    assert json.loads((path / "config.json").read_text())["vocab_size"] == MODEL_VOCAB
    return path, model


def exact_joint_of_second_and_third(model) -> torch.Tensor:
    """P(t2, t3) after PROMPT, summed over t1: from transformers' logits, temperature 1."""
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([PROMPT])).logits[0, -1], -1)
        contexts = torch.tensor([PROMPT + [a, b] for a in range(MODEL_VOCAB) for b in range(MODEL_VOCAB)])
        logits = model(contexts).logits
        p2 = torch.softmax(logits[::MODEL_VOCAB, -2], -1)                            # [t1, t2]
        p3 = torch.softmax(logits[:, -1], -1).view(MODEL_VOCAB, MODEL_VOCAB, MODEL_VOCAB)  # [t1, t2, t3]
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


def test_the_engine_samples_the_models_distribution_with_and_without_speculation(tiny_vocab_model, tmp_path):
    path, model = tiny_vocab_model
    exact = exact_joint_of_second_and_third(model)
    draft = perturbed_copy(path, tmp_path / "draft", noise=0.5)
    n = 3000
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=seed, ignore_eos=True) for seed in range(n)]
    counts = {}
    for method in (None, "ngram", "draft"):
        llm = LLM(str(path), speculative_method=method, speculative_ngram_min=1, block_size=4,
                  speculative_model=str(draft) if method == "draft" else None)
        outputs = llm.generate([PROMPT] * n, params)
        counts[method] = _pair_counts_of(outputs)
        if method:
            stats = llm.engine.scheduler.stats
            assert stats.num_drafts >= n   # every request verified drafts at its first decode step
            assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    p_values = {method or "plain": chi_square_p_value(counts[method], exact) for method in counts}
    control = chi_square_p_value(counts["ngram"].roll(1, dims=1), exact)
    print(f"engine, {n} seeded requests: p " + ", ".join(f"{m} {p:.3f}" for m, p in p_values.items())
          + f"; control p {control:.1e}")
    assert all(p > ALPHA for p in p_values.values())   # plain sampling fits too: the harness is right
    # Control: the model's tokens with the third one shifted by one do not fit.
    assert control < ALPHA


def _pair_counts_of(outputs) -> torch.Tensor:
    counts = torch.zeros(MODEL_VOCAB, MODEL_VOCAB)
    for output in outputs:
        counts[output.token_ids[1], output.token_ids[2]] += 1
    return counts
