"""Turns the last position's logits into the next token of each sequence.

Order: min_tokens (EOS and stop ids masked), penalties, then greedy argmax or temperature -> top-k ->
top-p -> min-p -> a draw. Draws use the exponential race (argmax of p / Exp(1) noise), which picks token
i with probability p_i; a request with a seed draws its noise from its own generator, so its tokens do not
depend on what else shares the batch. Logprobs are those of the model's raw distribution.
"""

import torch

from kubeinfer.runtime.engine.messages import TokenLogprobs
from kubeinfer.runtime.engine.sequence import Sequence


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...]):
        self.eos_token_ids = list(eos_token_ids)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprobs | None]]:
        logits = logits.float()
        raw_logprobs = None
        if any(seq.params.logprobs is not None for seq in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self._apply_min_tokens_and_penalties(logits.clone(), seqs)
        tokens = self._choose(logits, seqs)
        token_list = tokens.tolist()
        return token_list, self._logprobs(raw_logprobs, token_list, seqs)

    def _apply_min_tokens_and_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        for row, seq in enumerate(seqs):
            params = seq.params
            if seq.num_output_tokens < params.min_tokens:
                banned = params.stop_token_ids + ([] if params.ignore_eos else self.eos_token_ids)
                if banned:
                    logits[row, banned] = float("-inf")
            if params.has_penalties:
                _apply_penalties(logits[row], seq)
        return logits

    def _choose(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if all(seq.params.is_greedy for seq in seqs):
            return greedy
        device = logits.device
        temperature = torch.tensor([seq.params.temperature or 1.0 for seq in seqs], device=device)
        logits = logits / temperature.unsqueeze(1)
        top_k = [seq.params.top_k for seq in seqs]
        top_p = [seq.params.top_p for seq in seqs]
        if any(k != -1 for k in top_k) or any(p < 1 for p in top_p):
            logits = _top_k_top_p(logits, top_k, top_p)
        probs = torch.softmax(logits, dim=-1)
        min_p = [seq.params.min_p for seq in seqs]
        if any(min_p):
            threshold = torch.tensor(min_p, device=device).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < threshold, 0.0)
        noise = torch.empty_like(probs).exponential_()
        for row, seq in enumerate(seqs):
            if seq.params.seed is not None:
                if seq.generator is None:
                    seq.generator = torch.Generator(device=device).manual_seed(seq.params.seed)
                noise[row].exponential_(generator=seq.generator)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([seq.params.is_greedy for seq in seqs], device=device)
        return torch.where(is_greedy, greedy, sampled)

    @staticmethod
    def _logprobs(raw: torch.Tensor | None, tokens: list[int], seqs: list[Sequence]) -> list[TokenLogprobs | None]:
        if raw is None:
            return [None] * len(seqs)
        results: list[TokenLogprobs | None] = []
        for row, (seq, token) in enumerate(zip(seqs, tokens)):
            n = seq.params.logprobs
            if n is None:
                results.append(None)
                continue
            top = []
            if n > 0:
                values, indices = raw[row].topk(n)
                top = list(zip(indices.tolist(), values.tolist()))
            results.append(TokenLogprobs(token, raw[row, token].item(), top))
        return results


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """Repetition penalty (transformers' semantics, over prompt and output); presence and frequency
    penalties (OpenAI's semantics, over the output only)."""
    params, vocab = seq.params, logits.shape[-1]
    if params.repetition_penalty != 1:
        seen = torch.tensor(seq.token_ids, device=logits.device).unique()
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and seq.num_output_tokens:
        counts = torch.bincount(torch.tensor(seq.output_token_ids, device=logits.device), minlength=vocab)[:vocab]
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Masks all but the top-k tokens, then all but the smallest set whose probability reaches top-p."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    k = torch.tensor([vocab if value == -1 else min(value, vocab) for value in top_k], device=logits.device)
    sorted_logits = sorted_logits.masked_fill(ranks >= k.unsqueeze(1), float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs       # probability of the tokens ranked above
    p = torch.tensor(top_p, device=logits.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(before >= p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
