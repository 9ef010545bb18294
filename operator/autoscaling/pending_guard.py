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

**The rate now** is measured over every queue sample since the order while the replicas were saturated (the queue
above its band at each): what the ready ones served at their throughput plus the queue's growth, over 10-20 s
rather than the last pass's 5 (`arrivals_since`). Why (issue #28, 50 services on a quiet box, the operator at its
own 5 s cadence): compared pass by pass at two standard errors, 15 of 49 orders made while pods were pending were
for no higher rate. The passes' readings of a steady rate scattered 1.3-1.6x as widely as a Poisson count's (the
replicas' batches complete in lumps; a sample's time is a scrape's), and each of the 3-4 passes of a cold start was
a new draw against the same remembered reading. Pooled since the order, the passes of one cold start share their
data, so they are nearly one test, not four; the rate of a step that began before the order is all in it. A second
step after the order is diluted by the time before it, and orders later: by the end of the cold start at most,
when nothing is pending and the guard is off.

A recommendation up to the remembered one is not cut: a scale-up held back by `maxScaleUpStep` goes on towards it.
Once nothing is pending the guard is off: a backlog the pending replicas did not drain as planned (a cold start
longer than learned) is answered by the next pass from the fleet then ready. Rules that size for no arrival rate
(the backlog rule without a throughput per replica, TTFT, a decode pool's pressure) neither set nor meet the guard.
"""

from __future__ import annotations

import math

from kubeinfer.operator.autoscaling.observations import saturation_throughput
from kubeinfer.operator.autoscaling.policy_types import PolicyConfig, ReplicaCounts, ScaleHistory

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


def arrivals_since(hist: ScaleHistory, throughput: float | None, config: PolicyConfig) -> tuple[float, float] | None:
    """(req/s, span in seconds) arriving since the last scale-up, from its own queue sample (the last at or before
    it) to the latest: the ready replicas at each sample served `throughput` until the next, plus the queue's
    growth. None unless the queue was above its band at every sample (saturated: they served their throughput) and
    two samples span it."""
    up = next((e for e in reversed(hist.events) if e.to_replicas > e.from_replicas), None)
    if up is None or not throughput:
        return None
    samples = hist.queue_samples
    first = max((i for i, s in enumerate(samples) if s[0] <= up.time), default=None)
    if first is None or len(samples) - first < 2:
        return None
    since = samples[first:]
    if any(waiting <= config.target_queue_depth_per_replica * max(ready, 1) for _, waiting, _, ready in since):
        return None
    served = sum(a[3] * throughput * (b[0] - a[0]) for a, b in zip(since, since[1:]))
    span = since[-1][0] - since[0][0]
    return max(0.0, (served + since[-1][1] - since[0][1]) / span), span


def held_for_pending(rec: int, arrivals: tuple[float, float] | None, replicas: ReplicaCounts, hist: ScaleHistory,
                     config: PolicyConfig) -> tuple[int, str]:
    """(the recommendation a scale-up may act on, why it was cut or ""). `arrivals` is (req/s, span of the
    measurement in seconds) the recommending rule sized for, None for a rule that sizes for no arrival rate; the
    rate since the order replaces it where measurable (`arrivals_since`)."""
    sized = hist.scale_up_sized_for
    if replicas.pending == 0 or sized is None or arrivals is None:
        return rec, ""
    sized_rate, sized_rec, sized_span = sized
    cap = max(replicas.current, sized_rec)
    rate, span = arrivals_since(hist, saturation_throughput(hist, config), config) or arrivals
    if rec <= cap or risen(rate, span, sized_rate, sized_span, config.tolerance):
        return rec, ""
    return cap, (f"{replicas.pending} pending of the scale-up for {sized_rate:.1f} req/s, and {rate:.1f} req/s "
                 f"over the {span:.0f}s since is no rise beyond it")
