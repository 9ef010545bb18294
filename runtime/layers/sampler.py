"""Turns the last position's logits into the next token of each sequence.

Order: min_tokens (EOS and stop ids masked), penalties, logit_bias, the grammar's token mask and loop guard
(structured output), then greedy argmax or temperature -> top-k -> top-p -> min-p -> a draw. Draws use the
exponential race (argmax of p / Exp(1) noise), which picks token i with probability p_i; a request with a seed draws
its noise from its own generator, so its tokens do not depend on what else shares the batch. Logprobs are those of
the model's raw distribution.

`verify` is the speculative step: each sequence brings the logits of its last known token and of its k
draft tokens (k + 1 rows). Row j is processed as if drafts 1..j were already output (min_tokens and
penalties see them), so it is the exact distribution p_j that plain decoding would sample there. Draft j is
accepted with probability p_j(draft) (the proposer's distribution is one-hot: min(1, p/q) = p), else the
token is drawn from p_j with the draft removed and renormalised, and the sequence stops there; if all k
are accepted, row k gives one more token. A constrained sequence's row j is masked by its grammar as it stands
after drafts 0..j-1, so a draft the grammar refuses has probability 0 and is never accepted. The result has plain sampling's distribution (Leviathan et al.
2023, Chen et al. 2023); greedy rows accept a draft iff it is the argmax, so greedy output is plain greedy
output. A seeded request draws a row's noise from its own generator exactly as plain sampling does, and a
uniform for each draft row only, so a sequence without drafts in a step draws what plain decoding draws.
"""

import torch

from kubeinfer.kernels import ops
from kubeinfer.runtime.engine.messages import TokenLogprobs
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.structured.bitmask import apply_grammars
from kubeinfer.runtime.structured.duplicate_keys import end_repeating_objects
from kubeinfer.runtime.structured.loop_guard import ban_loops
from kubeinfer.runtime.structured.string_loops import close_looping_strings


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], loop_guard: bool = True):
        self.eos_token_ids = list(eos_token_ids)
        self.loop_guard = loop_guard   # --no-structured-loop-guard: False
        self.loop_bans = 0   # rows whose loop guard banned a token, since start (kubeinfer_structured_loop_bans_total)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprobs | None]]:
        logits = logits.float()
        raw_logprobs = None
        if any(seq.params.logprobs is not None for seq in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if _edits_logits(seqs):
            logits = self._apply_min_tokens_and_penalties(logits.clone(), seqs)
            if any(seq.guide is not None for seq in seqs):
                apply_grammars(logits, seqs)
                if self.loop_guard:
                    self.loop_bans += (ban_loops(logits, seqs) + close_looping_strings(logits, seqs)
                                       + end_repeating_objects(logits, seqs))
        greedy = ops.argmax(logits)
        if all(seq.params.is_greedy for seq in seqs):
            tokens = greedy
        else:
            probs = _probabilities(logits, seqs)
            sampled = (probs / self._noise(probs, seqs)).argmax(dim=-1)
            tokens = torch.where(_is_greedy(seqs, logits.device), greedy, sampled)
        token_list = tokens.tolist()
        return token_list, self._logprobs(raw_logprobs, token_list, seqs)

    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]
               ) -> tuple[list[list[int]], list[list[TokenLogprobs | None]]]:
        """The speculative step (see the module's doc). `logits` has len(drafts[i]) + 1 rows per sequence, in
        order; returns each sequence's tokens (its accepted drafts, then one drawn token) and their logprobs."""
        logits, device = logits.float(), logits.device
        row_seqs = [seq for seq, draft in zip(seqs, drafts) for _ in range(len(draft) + 1)]
        extras = [draft[:j] for draft in drafts for j in range(len(draft) + 1)]
        raw_logprobs = None
        if any(seq.params.logprobs is not None for seq in seqs):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if _edits_logits(seqs):
            logits = self._apply_min_tokens_and_penalties(logits.clone(), row_seqs, extras)
            if any(seq.guide is not None for seq in seqs):
                apply_grammars(logits, seqs, drafts)
                if self.loop_guard:
                    self.loop_bans += (ban_loops(logits, row_seqs, extras)
                                       + close_looping_strings(logits, row_seqs, extras)
                                       + end_repeating_objects(logits, row_seqs, extras))
        draft_ids = torch.tensor([draft[j] if j < len(draft) else -1 for draft in drafts
                                  for j in range(len(draft) + 1)], device=device)
        greedy = ops.argmax(logits)
        accepted, chosen = greedy == draft_ids, greedy
        if not all(seq.params.is_greedy for seq in seqs):
            probs = _probabilities(logits, row_seqs)
            is_draft = draft_ids >= 0
            index = draft_ids.clamp(min=0).unsqueeze(1)
            draft_probs = probs.gather(1, index).squeeze(1)
            noise, uniform = self._noise(probs, row_seqs, is_draft.tolist())
            residual = probs.scatter(1, index, torch.where(is_draft, 0.0, draft_probs).unsqueeze(1))
            is_greedy = _is_greedy(row_seqs, device)
            accepted = torch.where(is_greedy, accepted, uniform < draft_probs)
            chosen = torch.where(is_greedy, greedy, (residual / noise).argmax(dim=-1))
        accepted_list, chosen_list = accepted.tolist(), chosen.tolist()
        tokens, rows, row = [], [], 0
        for draft in drafts:
            kept = 0
            while kept < len(draft) and accepted_list[row + kept]:
                kept += 1
            tokens.append(draft[:kept] + [chosen_list[row + kept]])
            rows.append(range(row, row + kept + 1))
            row += len(draft) + 1
        if raw_logprobs is None:
            return tokens, [[None] * len(t) for t in tokens]
        logprobs = []
        for seq, seq_tokens, seq_rows in zip(seqs, tokens, rows):
            logprobs.append(self._logprobs(raw_logprobs[list(seq_rows)], seq_tokens, [seq] * len(seq_tokens)))
        return tokens, logprobs

    def _apply_min_tokens_and_penalties(self, logits: torch.Tensor, seqs: list[Sequence],
                                        extras: list[list[int]] | None = None) -> torch.Tensor:
        """`extras[row]`: tokens taken as output after the sequence's own (the drafts before a verified row)."""
        for row, seq in enumerate(seqs):
            params, extra = seq.params, extras[row] if extras else ()
            if seq.num_output_tokens + len(extra) < params.min_tokens:
                banned = params.stop_token_ids + ([] if params.ignore_eos else self.eos_token_ids)
                if banned:
                    logits[row, banned] = float("-inf")
            if params.has_penalties:
                _apply_penalties(logits[row], seq, extra)
            if params.logit_bias:
                ids = list(params.logit_bias)
                logits[row, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype,
                                                 device=logits.device)
        return logits

    @staticmethod
    def _noise(probs: torch.Tensor, seqs: list[Sequence], draft_rows: list[bool] | None = None):
        """Exp(1) noise per row (and, given `draft_rows`, a uniform per row for acceptance); a seeded
        sequence's rows are drawn from its own generator, the uniform only for its draft rows."""
        noise = torch.empty_like(probs).exponential_()
        uniform = None if draft_rows is None else torch.rand(len(seqs), device=probs.device)
        for row, seq in enumerate(seqs):
            if seq.params.seed is not None:
                if seq.generator is None:
                    seq.generator = torch.Generator(device=probs.device).manual_seed(seq.params.seed)
                    for _ in range(seq.num_output_tokens):   # a resumed request: the draws its output took
                        noise[row].exponential_(generator=seq.generator)
                noise[row].exponential_(generator=seq.generator)
                if draft_rows is not None and draft_rows[row]:
                    uniform[row] = torch.rand((), generator=seq.generator, device=probs.device)
        return noise if draft_rows is None else (noise, uniform)

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


def _edits_logits(seqs: list[Sequence]) -> bool:
    """Whether any row's logits are changed before the draw (min_tokens, penalties, logit_bias, a grammar): only
    then are they copied first (the caller's stay as they were). A step's copy of 64 rows of a 152k vocabulary is
    39 MB of fresh pages, 21 ms on the 2-vCPU box, most of a greedy step's sampling."""
    return any(seq.params.min_tokens or seq.params.has_penalties or seq.params.logit_bias or seq.guide is not None
               for seq in seqs)


def _probabilities(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """What a draw picks from, per row: temperature, then top-k, top-p and min-p (unnormalised after min-p)."""
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
        probs = probs / probs.sum(dim=-1, keepdim=True)   # acceptance compares a uniform with these
    return probs


def _is_greedy(seqs: list[Sequence], device) -> torch.Tensor:
    return torch.tensor([seq.params.is_greedy for seq in seqs], device=device)


def _apply_penalties(logits: torch.Tensor, seq: Sequence, extra: list[int] | tuple = ()) -> None:
    """Repetition penalty (transformers' semantics, over prompt and output); presence and frequency
    penalties (OpenAI's semantics, over the output only). `extra`: output tokens after the sequence's own."""
    params, vocab = seq.params, logits.shape[-1]
    if params.repetition_penalty != 1:
        seen = torch.tensor(seq.token_ids + list(extra), device=logits.device).unique()
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    output = seq.output_token_ids + list(extra)
    if (params.presence_penalty or params.frequency_penalty) and output:
        counts = torch.bincount(torch.tensor(output, device=logits.device), minlength=vocab)[:vocab]
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
