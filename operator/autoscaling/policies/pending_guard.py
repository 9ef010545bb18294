"""No replica stacked on pending pods: while the replicas of the last scale-up are still pending, the reactive policy
orders more only when the arrival rate it measures has risen beyond the one that scale-up was sized for.

Why (issue #28): a scale-up sized for an arrival rate has answered it; its replicas take a cold start to serve, and
meanwhile every pass sees the queue they were ordered for grow. The drain rule (`drain_sizing`) counts the pending
replicas as capacity on its way, but its arrival estimate is the queue's growth over one pass, a Poisson count of a
few seconds: it reads a steady rate 15-30% high or low from pass to pass, and a high reading beyond the fleet ordered
ordered more for the same traffic. So each scale-up remembers (`ScaleHistory.scale_up_sized_for`, kept in status so
that a restarted operator holds the same guard) the arrival rate its rule measured and the replicas it recommended.
While replicas are pending, a recommendation above both the fleet ordered and that one's is cut to the larger of the
two unless the rate measured now exceeds the remembered one:

- by more than the policy's `tolerance`, as every other comparison of the policy, and
- by more than three standard errors of the difference of the two measurements, each a Poisson count of arrivals
  over its span: `3 x sqrt(rate x (1 / span then + 1 / span now))` at the rate of the two counts pooled (a 5 s
  pass at 7 req/s against 15 s since, both 7: +-2.2 req/s). The remembered one is a count of a few seconds, no more
  exact than the new one, so a low reading that sized the order and a high one now are no rise if their noise
  explains them. A burst's step (4-10x) is far beyond it. A step that began inside the pass that ordered is seen
  in part by that pass, and in full by the next: that second order is for traffic the first did not see.

**The rate now** is read from every queue sample since the order, pooled while the replicas were saturated (the
queue above its band at each): what the ready ones served at their throughput plus the queue's growth
(`arrivals_since`), over all of them and over the latest 10 s of them (two passes at least); either shows a rise.
The pass's own reading decides only where neither can be read (the queue within its band since the order). Why
(issue #28, 50 services on a quiet box, the operator at its own 5 s cadence): compared pass by pass at two standard
errors of the remembered rate, 15 of 49 orders made while pods were pending were for no higher rate. The passes'
readings of a steady rate scattered 1.3-1.6x as widely as a Poisson count's (part of that was the benchmark's
stand-in, which put a queue beside the next second's time until 2026-11-27; the three standard errors were not
re-tuned without it), each of a cold start's 3-4 passes was a new draw against the same remembered
reading, and a low remembered reading made the noise small just where a high one followed. All samples since the
order make the passes of a cold start nearly one test; the latest 10 s find a step after the order within two
passes, where all of them would dilute it by the time before it (12 -> 24 req/s on a 60 s cold start: not seen
until the drain had no more use for it); the pass alone, tested at three standard errors too, let 8 through.
"""

from __future__ import annotations

import math

from kubeinfer.operator.autoscaling.policies.drain_sizing import saturated_arrivals
from kubeinfer.operator.autoscaling.policies.observations import saturation_throughput
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts

# A rise in the measured arrival rate smaller than this many standard errors of the difference of two Poisson counts'
# rates is noise (module docstring: the readings scatter wider than a Poisson count's).
NOISE_STANDARD_ERRORS = 3.0


def risen(rate: float, span_s: float, sized_for: float, sized_span_s: float, tolerance: float) -> bool:
    """Whether `rate`, measured over `span_s` seconds, is beyond `sized_for`, measured over `sized_span_s`, by more
    than the tolerance and the noise of the two Poisson counts, at the rate both would share if neither had risen
    (their pooled count over their pooled span: a remembered reading that came out low would otherwise make the
    noise small just where a high one follows it). A span of 0 (one queue sample: no arrival rate measured) shows
    no rise."""
    if min(span_s, sized_span_s) <= 0:
        return False
    shared = max(0.0, (rate * span_s + sized_for * sized_span_s) / (span_s + sized_span_s))
    noise = NOISE_STANDARD_ERRORS * math.sqrt(shared * (1 / span_s + 1 / sized_span_s))
    return rate > sized_for * (1 + tolerance) and rate - sized_for > noise


# The latest queue samples since the order, over this many seconds and at least two passes, are read beside all of
# them: a step after the order shows there within two passes, where all of them would dilute it.
LATEST_SPAN_S = 10.0


def arrivals_since(hist: ScaleHistory, throughput: float | None, config: PolicyConfig) -> list[tuple[float, float]]:
    """(req/s, span in seconds) arriving since the last scale-up, from its own queue sample (the last at or before
    it) to the latest (`drain_sizing.saturated_arrivals`), and over those within LATEST_SPAN_S of the latest if they
    span two passes (three samples). None of them unless the queue was above its band at every sample since the
    order (saturated: the ready replicas served their throughput) and two samples span it."""
    up = next((e for e in reversed(hist.events) if e.to_replicas > e.from_replicas), None)
    if up is None or not throughput:
        return []
    samples = hist.queue_samples
    first = max((i for i, s in enumerate(samples) if s[0] <= up.time), default=None)
    if first is None or len(samples) - first < 2:
        return []
    since = samples[first:]
    if any(waiting <= config.target_queue_depth_per_replica * max(ready, 1) for _, waiting, _, ready in since):
        return []
    latest = [s for s in since if s[0] >= since[-1][0] - LATEST_SPAN_S - 1e-6]
    spans = [since] + ([latest] if len(latest) >= 3 else [])
    return [(saturated_arrivals(span, throughput), span[-1][0] - span[0][0]) for span in spans]


def held_for_pending(rec: int, arrivals: tuple[float, float] | None, replicas: ReplicaCounts, hist: ScaleHistory,
                     config: PolicyConfig) -> tuple[int, str]:
    """(the recommendation a scale-up may act on, why it was cut or ""). `arrivals` is (req/s, span of the
    measurement in seconds) the recommending rule sized for, None for a rule that sizes for no arrival rate; the
    readings since the order (`arrivals_since`), where measurable, are tested in its place."""
    sized = hist.scale_up_sized_for
    if replicas.pending == 0 or sized is None or arrivals is None:
        return rec, ""
    sized_rate, sized_rec, sized_span = sized
    cap = max(replicas.current, sized_rec)
    if rec <= cap:
        return rec, ""
    readings = arrivals_since(hist, saturation_throughput(hist, config), config) or [arrivals]
    if any(risen(rate, span, sized_rate, sized_span, config.tolerance) for rate, span in readings):
        return rec, ""
    seen = ", ".join(f"{rate:.1f} req/s over {span:.0f}s" for rate, span in readings)
    return cap, (f"{replicas.pending} pending of the scale-up for {sized_rate:.1f} req/s, and {seen} is no rise "
                 f"beyond it")
