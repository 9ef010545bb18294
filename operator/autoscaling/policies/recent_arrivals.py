"""The fast arrival signal of the predictive policy: arrivals counted over the last few seconds, used only when
they say, beyond their own Poisson noise, that the rate is well above the metric window's.

The slow estimate (`observations.arrival_rate`: first tokens per second over the 60 s metric window plus the
queue's change over it) is smooth but follows a step over a whole window. The recent estimate (first tokens per
second over `RECENT_RANGE_S`, from the same fleet round of queries, plus the queue's recent change, where arrivals
beyond a short fleet show first: `recent_queue_change`) follows it within a tick or two, but is noisy: fed on
steady traffic, it would buy replicas for Poisson clumps. So it replaces the slow estimate only where its count is
significantly above what the slow rate predicts (`Z_SIGNIFICANT` standard deviations of a Poisson count,
one-sided), i.e. on a rise; a fall, and so every scale-down, stays on the slow estimate. A missing recent signal is
no signal: the slow estimate stands.
"""

from __future__ import annotations

import math

from kubeinfer.operator.autoscaling.policies.types import ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import RECENT_COUNT_SPAN_S, Signals

# How many standard deviations of a Poisson count above the slow rate's expectation make a rise.
Z_SIGNIFICANT = 3.0


def recent_queue_change(hist: ScaleHistory, span_s: float = RECENT_COUNT_SPAN_S) -> float:
    """Waiting requests added per second, to add to the first tokens per second over the `span_s` before the last
    queue sample (0 with fewer than two samples):
    - where the queue fell between two of its samples within the span (from the earlier sample nearest to the
      span's start, or the history's oldest), its change over that span: first tokens plus it are then the
      requests that arrived in the span. Over the last tick only, a backlog that fresh replicas drain within the
      count's span reads as arrivals: its first tokens count in full, its fall only in part (burst 10x at 15 s:
      176 waiting requests drained read 32.6 req/s for 15 arriving, and the fleet went 7 -> 11).
    - where it did not fall (a rise, or none waiting), its change over the last tick: the fleet answered at its
      own pace over the span, and the newest change tells the newest arrivals, which the span's average lags on a
      ramp (flash crowd at 5 s: 97.2% of requests within target against 96.1% with the span's change)."""
    samples = hist.queue_samples
    if len(samples) < 2:
        return 0.0
    last = samples[-1]
    first = min(samples[:-1], key=lambda s: abs(s[0] - (last[0] - span_s)))
    within = samples[samples.index(first):]
    if any(later[1] < earlier[1] for earlier, later in zip(within, within[1:])):
        return (last[1] - first[1]) / (last[0] - first[0])
    tick = samples[-2]
    return (last[1] - tick[1]) / (last[0] - tick[0])


def recent_arrival_rate(hist: ScaleHistory, signals: Signals) -> float | None:
    """Requests arriving per second recently: first tokens per second over the recent range plus the queue's
    recent change (`recent_queue_change`; None without a recent first-token rate)."""
    if signals.recent_request_rate is None or not math.isfinite(signals.recent_request_rate):
        return None
    return max(0.0, signals.recent_request_rate + recent_queue_change(hist))


def significantly_above(recent_rate: float, slow_rate: float, span_s: float = RECENT_COUNT_SPAN_S,
                        z: float = Z_SIGNIFICANT) -> bool:
    """Whether `recent_rate` over `span_s` is a rise over `slow_rate`: its count exceeds the slow rate's
    expected count by `z` standard deviations of a Poisson count (taken as at least 1, so that from an idle
    service it takes more than `z` arrivals)."""
    expected = max(0.0, slow_rate) * span_s
    return recent_rate * span_s > expected + z * math.sqrt(max(expected, 1.0))


def arrival_estimate(hist: ScaleHistory, signals: Signals, slow_rate: float) -> tuple[float, bool]:
    """(the rate to forecast from, whether it is the recent one): the recent rate where it is a significant
    rise over `slow_rate`, else `slow_rate`."""
    recent = recent_arrival_rate(hist, signals)
    if recent is not None and significantly_above(recent, slow_rate):
        return recent, True
    return slow_rate, False
