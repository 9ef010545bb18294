"""What a policy of the simulator may read at a tick (`Observation`): the replica counts, the per-second samples,
the cold starts it saw, and the signals Prometheus would answer (`signals`: gauges at the last scrape, rates and
the calibration series over the metric window, the recent first-token rate over `RECENT_RANGE_S`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Protocol

from kubeinfer.operator.autoscaling.signals.cold_start import ColdStartSample
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.autoscaling.signals.measured import RECENT_RANGE_S
from kubeinfer.operator.autoscaling.signals.metrics_histogram import TTFT_BUCKETS, cumulative_counts, histogram_quantile

from .replica_metrics import usage_between


class SimulationView(Protocol):
    """What an observation reads of a running `sim.Simulation` (typed here: sim.py imports this module)."""
    samples: Any            # per-second samples: t, concurrency, waiting, running, usage
    replicas: list[Any]     # every replica made, in order: created, ready_at, terminated, rid
    num_initial: int        # the replicas there at the start
    ttft_times: list[float]
    ttft_values: list[float]


@dataclass(frozen=True)
class Observation:
    """What a policy may read at a tick."""

    now: float
    current: int  # replicas asked for (spec.replicas)
    ready: int
    pending: int
    sim: SimulationView

    def concurrency(self, seconds: float) -> list[float]:
        """Per-second samples of requests in the system (waiting + running) over the last `seconds`."""
        s = self.sim.samples
        i = bisect_left(s.t, self.now - seconds)
        return s.concurrency[i:]

    def cold_starts(self) -> list[ColdStartSample]:
        """Creation -> ready of the replicas the simulation created that have become ready (what the
        operator reads from its pods; the replicas that were there at the start are not observed)."""
        return [ColdStartSample(f"replica-{r.rid}", r.created, r.ready_at)
                for r in self.sim.replicas[self.sim.num_initial:]
                if r.ready_at <= self.now and (r.terminated is None or r.terminated >= r.ready_at)]

    def signals(self, scrape_interval_s: float, window_s: float) -> Signals:
        """What Prometheus would answer: gauges at the last scrape, TTFT P95 over the window before it."""
        s = self.sim.samples
        scrape_t = math.floor(self.now / scrape_interval_s) * scrape_interval_s
        i = bisect_right(s.t, scrape_t) - 1
        if i < 0:
            return Signals.missing("no scrape yet", self.now)
        tt = self.sim.ttft_times
        lo, hi = bisect_right(tt, scrape_t - window_s), bisect_right(tt, scrape_t)
        values = self.sim.ttft_values[lo:hi]
        p95 = histogram_quantile(0.95, cumulative_counts(values, TTFT_BUCKETS)) if values else None
        # The snapshot a window before the one read (None: from zero). A tick comes before the same second's sample,
        # so the one read is a second old: measured from scrape_t, the usage covered 9 s of a 10 s window, and the
        # calibration counted a tenth too few requests and steps (docs/benchmarks/autoscaling.md, 2026-11-27).
        j = bisect_right(s.t, s.t[i] - window_s) - 1
        usage = usage_between(s.usage[j] if j >= 0 else None, s.usage[i])
        return Signals(timestamp=scrape_t, queue_depth=s.waiting[i], num_running=s.running[i],
                       ttft_p95_seconds=p95, request_rate=len(values) / window_s, usage=usage,
                       recent_request_rate=self._recent_rate(scrape_t, scrape_interval_s))

    def _recent_rate(self, scrape_t: float, scrape_interval_s: float) -> float | None:
        """Prometheus' `rate(first tokens[RECENT_RANGE_S])` at `scrape_t`: the increase between the oldest and the
        newest scrape within the range, over their span (None with one scrape in it)."""
        span = math.ceil(RECENT_RANGE_S / scrape_interval_s - 1) * scrape_interval_s
        if span <= 0:
            return None
        tt = self.sim.ttft_times
        return (bisect_right(tt, scrape_t) - bisect_right(tt, scrape_t - span)) / span
