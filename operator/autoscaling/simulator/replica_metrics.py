"""The calibration series the simulated replicas export, as the runtime does (kubeinfer.runtime.server.metrics):
the step moments (`kubeinfer_engine_step_moments_total` with the step histogram's count and sum) and the
histograms of prompt and generated tokens per request, summed over the fleet. The simulator snapshots the totals
every second; a policy reads a window's increase as Prometheus' `increase()` would give it.
"""

from __future__ import annotations

from bisect import bisect_left

from kubeinfer.operator.autoscaling.signals.metrics_histogram import GENERATION_TOKEN_BUCKETS, PROMPT_TOKEN_BUCKETS
from kubeinfer.operator.autoscaling.sizing.calibration import ReplicaUsage, StepMoments

_INF = float("inf")


class UsageCounters:
    __slots__ = ("moments", "prompt", "generation")

    def __init__(self):
        self.moments = [0.0] * 9   # StepMoments' fields: steps, t, n, p, nn, np, pp, nt, pt
        self.prompt = [0] * (len(PROMPT_TOKEN_BUCKETS) + 1)        # per bucket (not cumulative), +Inf last
        self.generation = [0] * (len(GENERATION_TOKEN_BUCKETS) + 1)

    def step(self, n: int, p: int, t: float) -> None:
        m = self.moments
        m[0] += 1
        m[1] += t
        m[2] += n
        m[3] += p
        m[4] += n * n
        m[5] += n * p
        m[6] += p * p
        m[7] += n * t
        m[8] += p * t

    def first_token(self, prompt: int) -> None:
        self.prompt[bisect_left(PROMPT_TOKEN_BUCKETS, prompt)] += 1

    def finished(self, generated: int) -> None:
        self.generation[bisect_left(GENERATION_TOKEN_BUCKETS, generated)] += 1

    def snapshot(self) -> tuple:
        return tuple(self.moments), tuple(self.prompt), tuple(self.generation)


def _cumulative(bounds: tuple, counts: list) -> tuple[tuple[float, float], ...]:
    out, total = [], 0.0
    for bound, c in zip((*bounds, _INF), counts):
        total += c
        out.append((float(bound), total))
    return tuple(out)


def usage_between(old: tuple | None, new: tuple) -> ReplicaUsage:
    """The increase from snapshot `old` (None: from zero) to `new`."""
    if old is None:
        old = ((0.0,) * 9, (0,) * len(new[1]), (0,) * len(new[2]))
    moments = StepMoments(*(b - a for a, b in zip(old[0], new[0])))
    prompt = [b - a for a, b in zip(old[1], new[1])]
    generation = [b - a for a, b in zip(old[2], new[2])]
    return ReplicaUsage(moments, _cumulative(PROMPT_TOKEN_BUCKETS, prompt),
                        _cumulative(GENERATION_TOKEN_BUCKETS, generation))
