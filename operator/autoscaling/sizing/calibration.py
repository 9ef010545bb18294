"""The replica model calibrated from the service's own metrics. Pure.

The runtime exports, per engine step, sums of the step's decoding sequences n, prefill tokens p, seconds t and
their products (`kubeinfer_engine_step_moments_total{moment}`, with the step count and seconds of
`kubeinfer_engine_step_seconds`): the sufficient statistics of the least-squares fit t ~ a + b n + c p, so a
window's increase, summed over the pods, gives the fit over every step of the fleet in that window, which is the
simulator's step cost (`replica_model.ReplicaModel`: decode base, per decoding sequence, per prefill token). The
request mix is the histograms of prompt and generated tokens per request (`kubeinfer_request_prompt_tokens`,
`kubeinfer_request_generation_tokens`).

`Calibration` keeps both, each pass adding the window's increase weighted by the share of the window that is new
and discounting the old by a half-life, so it follows a service that changes (a new model, a new mix). It is
`ready` once it holds enough steps, requests and spread in n and p for the fit to say something.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

HALF_LIFE_S = 1800.0
MIN_STEPS = 500.0       # steps (weighted) before the fit is used
MIN_REQUESTS = 200.0    # requests (weighted) in each histogram before the mix is used
MIN_SPREAD = 1e-3       # the fit's design must not be this close to singular (det of its correlation matrix)
MOMENTS = ("n", "p", "nn", "np", "pp", "nt", "pt")   # the runtime's `moment` label values
Buckets = tuple[tuple[float, float], ...]           # cumulative (upper bound, count), +Inf last


@dataclass(frozen=True)
class StepMoments:
    steps: float = 0.0
    t: float = 0.0
    n: float = 0.0
    p: float = 0.0
    nn: float = 0.0
    np: float = 0.0
    pp: float = 0.0
    nt: float = 0.0
    pt: float = 0.0

    def scaled(self, factor: float) -> StepMoments:
        return StepMoments(*(getattr(self, f.name) * factor for f in fields(self)))

    def plus(self, other: StepMoments) -> StepMoments:
        return StepMoments(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def fit(self, nonnegative: bool = False) -> tuple[float, float, float] | None:
        """(seconds per step, per decoding sequence, per prefill token) by least squares; None when the steps
        do not tell the three apart (too few, or n and p without spread).

        `nonnegative`: the least-squares fit with no cost below zero (and the per-token one above it), None if
        there is none. On a CPU replica of a tiny model a step costs about the same at 1 and at 4 sequences, and
        the free fit read a per-sequence cost of -0.66 to -0.22 ms for 200 s of a real replay, so no model was
        ever made from it (docs/benchmarks/autoscaling.md, 2026-11-27). With three unknowns the constrained optimum
        is the unconstrained fit over one of the subsets that keep the per-token cost: each feasible one is solved and
        the one that explains the most wins (its residual is the steps' total sum of squares, not exported,
        less that)."""
        if self.steps <= 0 or self.n <= 0 or self.p <= 0:
            return None
        s, mn, mp = self.steps, self.n / self.steps, self.p / self.steps
        # normal equations in the scaled variables 1, n / mean n, p / mean p (all of order 1)
        a = [[1.0, 1.0, 1.0],
             [1.0, self.nn / (s * mn * mn), self.np / (s * mn * mp)],
             [1.0, self.np / (s * mn * mp), self.pp / (s * mp * mp)]]
        b = [self.t / s, self.nt / (s * mn), self.pt / (s * mp)]
        if _det(a) / (a[1][1] * a[2][2]) < MIN_SPREAD:
            return None
        best: tuple[float, list[float]] | None = None
        for kept in ((0, 1, 2), (0, 2), (1, 2), (2,)) if nonnegative else ((0, 1, 2),):
            y_kept = _solve([[a[r][c] for c in kept] for r in kept], [b[r] for r in kept])
            if nonnegative and (min(y_kept) < 0 or y_kept[-1] <= 0):
                continue
            explained = sum(y * b[r] for y, r in zip(y_kept, kept))
            if best is None or explained > best[0]:
                y = [0.0, 0.0, 0.0]
                for value, r in zip(y_kept, kept):
                    y[r] = value
                best = (explained, y)
        if best is None:
            return None
        y = best[1]
        return y[0], y[1] / mn, y[2] / mp


def _det(a: list[list[float]]) -> float:
    return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (up to 3 x 3, well conditioned once scaled)."""
    k = len(b)
    m = [row[:] + [b[r]] for r, row in enumerate(a)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, k):
            f = m[r][col] / m[col][col]
            for c in range(col, k + 1):
                m[r][c] -= f * m[col][c]
    out = [0.0] * k
    for r in range(k - 1, -1, -1):
        out[r] = (m[r][k] - sum(m[r][c] * out[c] for c in range(r + 1, k))) / m[r][r]
    return out


@dataclass(frozen=True)
class ReplicaUsage:
    """What the fleet's replicas did over a metric window (increases, summed over the pods)."""
    moments: StepMoments
    prompt_tokens: Buckets = ()       # per request, cumulative
    generation_tokens: Buckets = ()


def _decay_buckets(old: Buckets, new: Buckets, keep: float, weight: float) -> Buckets:
    merged = {le: c * keep for le, c in old}
    for le, c in new:
        merged[le] = merged.get(le, 0.0) + c * weight
    return tuple(sorted(merged.items()))


def _total(buckets: Buckets) -> float:
    return buckets[-1][1] if buckets and math.isinf(buckets[-1][0]) else 0.0


@dataclass(frozen=True)
class Calibration:
    moments: StepMoments = StepMoments()
    prompt_tokens: Buckets = ()
    generation_tokens: Buckets = ()
    updated_at: float | None = None

    def observe(self, usage: ReplicaUsage | None, now: float, window_s: float,
                half_life_s: float = HALF_LIFE_S) -> Calibration:
        """Adds a window's usage, weighted by the part of it not seen at the last pass."""
        if usage is None:
            return self
        dt = window_s if self.updated_at is None else min(max(now - self.updated_at, 0.0), window_s)
        if dt <= 0:
            return self
        keep, weight = 0.5 ** (dt / half_life_s), dt / window_s
        return Calibration(self.moments.scaled(keep).plus(usage.moments.scaled(weight)),
                           _decay_buckets(self.prompt_tokens, usage.prompt_tokens, keep, weight),
                           _decay_buckets(self.generation_tokens, usage.generation_tokens, keep, weight), now)

    @property
    def step_costs(self) -> tuple[float, float, float] | None:
        """The fitted (decode base, per decoding sequence, per prefill token) seconds once there is enough data:
        the least-squares fit with no cost below zero and a per-token cost above it (`StepMoments.fit`)."""
        if self.moments.steps < MIN_STEPS:
            return None
        return self.moments.fit(nonnegative=True)

    def waiting_for(self) -> str | None:
        """What the calibration lacks before a replica model can be made from it, in words; None when it has it."""
        missing = []
        if self.moments.steps < MIN_STEPS:
            missing.append(f"{self.moments.steps:.0f} of {MIN_STEPS:.0f} engine steps")
        if self.requests < MIN_REQUESTS:
            missing.append(f"{self.requests:.0f} of {MIN_REQUESTS:.0f} finished requests")
        if not missing and self.step_costs is None:
            costs = self.moments.fit()
            missing.append("engine steps whose batch sizes and prefill tokens vary apart (the fit cannot tell the "
                           "per-sequence cost from the per-token one)" if costs is None else
                           "steps whose time grows with their prefill tokens (the fit reads %.3g s a step, %.3g s a "
                           "sequence, %.3g s a prefill token)" % costs)
        return ", ".join(missing) or None

    @property
    def requests(self) -> float:
        """The requests (weighted) behind the mix: the fewer of its two histograms' counts."""
        return min(_total(self.prompt_tokens), _total(self.generation_tokens))

    @property
    def has_mix(self) -> bool:
        return self.requests >= MIN_REQUESTS

    def to_dict(self) -> dict:
        return {"moments": {f.name: self.moments.__dict__[f.name] for f in fields(StepMoments)},
                "promptTokens": [[_le(le), c] for le, c in self.prompt_tokens],
                "generationTokens": [[_le(le), c] for le, c in self.generation_tokens],
                "updatedAt": self.updated_at}

    @classmethod
    def from_dict(cls, data: dict | None) -> Calibration:
        if not data:
            return cls()
        return cls(StepMoments(**data.get("moments", {})),
                   tuple((float(le), c) for le, c in data.get("promptTokens", ())),
                   tuple((float(le), c) for le, c in data.get("generationTokens", ())), data.get("updatedAt"))


def _le(bound: float) -> float | str:
    return "+Inf" if math.isinf(bound) else bound


def quantiles(buckets: Buckets, count: int, at_upper_bound: bool) -> list[int]:
    """`count` values at the probabilities (i + 0.5) / count of a cumulative histogram: at the upper bound of the
    bucket that holds each (conservative: a prompt is priced as the longest of its bucket), or interpolated in
    it as PromQL's histogram_quantile does. The +Inf bucket gives the highest finite bound."""
    total = _total(buckets)
    assert total > 0, "an empty histogram has no quantiles"
    out, lower, below = [], 0.0, 0.0
    i = 0
    for k in range(count):
        rank = (k + 0.5) / count * total
        while buckets[i][1] < rank and i < len(buckets) - 1:
            lower, below = buckets[i][0], buckets[i][1]
            i += 1
        upper, at = buckets[i]
        if math.isinf(upper):
            value = lower
        elif at_upper_bound or at <= below:
            value = upper
        else:
            value = lower + (upper - lower) * (rank - below) / (at - below)
        out.append(max(1, math.ceil(value)))
    return out


def with_costs(model, costs: tuple[float, float, float]):
    """`model` (a replica_model.ReplicaModel) with the calibrated step costs."""
    base, per_seq, per_token = costs
    return replace(model, decode_base_s=base, decode_per_seq_s=per_seq, prefill_s_per_token=per_token)


def usage_from(steps: float | None, seconds: float | None, moments: dict[str, float], prompt: dict[float, float],
               generation: dict[float, float]) -> ReplicaUsage | None:
    """A window's usage from the increases of the step histogram's count and sum, the step moments by label, and
    the two length histograms' buckets by bound; None without the step series (a runtime that does not export
    them)."""
    if steps is None or seconds is None or not moments:
        return None
    return ReplicaUsage(StepMoments(steps, seconds, *(moments.get(name, 0.0) for name in MOMENTS)),
                        tuple(sorted(prompt.items())), tuple(sorted(generation.items())))
