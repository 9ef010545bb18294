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
- by more than two standard errors of the difference of the two measurements, each a Poisson count of arrivals
  over its span: `2 x sqrt(rate x (1 / span then + 1 / span now))` at the remembered rate (two 5 s passes at
  7 req/s: +-1.7 req/s). Both are counts of a few seconds; the remembered one is no more exact than the new one, so
  a low reading that sized the order and a high one now are no rise if their noise explains them. A burst's step
  (4-10x) is far beyond it. A step that began inside the pass that ordered is seen in part by that pass, and in
  full by the next: that second order is for traffic the first did not see.

A recommendation up to the remembered one is not cut: a scale-up held back by `maxScaleUpStep` goes on towards it.
Once nothing is pending the guard is off: a backlog the pending replicas did not drain as planned (a cold start
longer than learned) is answered by the next pass from the fleet then ready. Rules that size for no arrival rate
(the backlog rule without a throughput per replica, TTFT, a decode pool's pressure) neither set nor meet the guard.
"""

from __future__ import annotations

import math

from kubeinfer.operator.autoscaling.policy_types import PolicyConfig, ReplicaCounts, ScaleHistory

# A rise in the measured arrival rate smaller than this many standard errors of the difference of two Poisson counts'
# rates is noise.
NOISE_STANDARD_ERRORS = 2.0


def risen(rate: float, span_s: float, sized_for: float, sized_span_s: float, tolerance: float) -> bool:
    """Whether `rate`, measured over `span_s` seconds, is beyond `sized_for`, measured over `sized_span_s`, by more
    than the tolerance and the noise of the two Poisson counts (at the rate `sized_for`). A span of 0 (one queue
    sample: no arrival rate measured) shows no rise."""
    if min(span_s, sized_span_s) <= 0:
        return False
    noise = NOISE_STANDARD_ERRORS * math.sqrt(max(sized_for, 0.0) * (1 / span_s + 1 / sized_span_s))
    return rate > sized_for * (1 + tolerance) and rate - sized_for > noise


def held_for_pending(rec: int, arrivals: tuple[float, float] | None, replicas: ReplicaCounts, hist: ScaleHistory,
                     config: PolicyConfig) -> tuple[int, str]:
    """(the recommendation a scale-up may act on, why it was cut or ""). `arrivals` is (req/s, span of the
    measurement in seconds) the recommending rule sized for, None for a rule that sizes for no arrival rate."""
    sized = hist.scale_up_sized_for
    if replicas.pending == 0 or sized is None or arrivals is None:
        return rec, ""
    sized_rate, sized_rec, sized_span = sized
    cap = max(replicas.current, sized_rec)
    rate, span = arrivals
    if rec <= cap or risen(rate, span, sized_rate, sized_span, config.tolerance):
        return rec, ""
    return cap, (f"{replicas.pending} pending of the scale-up for {sized_rate:.1f} req/s, and {rate:.1f} req/s "
                 f"is no rise beyond it")
