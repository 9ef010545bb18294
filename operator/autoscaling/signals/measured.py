"""What the autoscaler measures for one InferenceService and decides from: its `Signals` (read by the sources of
this room: Prometheus, or the pods' /metrics) and its `ReplicaCounts` (read from its pods, `pods`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.autoscaling.sizing.calibration import ReplicaUsage
from kubeinfer.operator.times import rfc3339_precise

# The PromQL range of the recent first-token rate (`rate(...[15s])`), and the span its count covers: at the
# default 5 s scrape interval the range holds three samples 10 s apart and Prometheus' rate is their increase
# over those 10 s (extrapolated to the range, which leaves the rate as it is). A scrape interval of 15 s or more
# leaves one sample in the range: no recent rate, so the slow estimate decides.
RECENT_RANGE_S = 15
RECENT_COUNT_SPAN_S = 10.0

@dataclass(frozen=True)
class Signals:
    """What the metrics sources measure for one InferenceService. `None` means unknown."""

    timestamp: float  # unix seconds at which the values were sampled
    queue_depth: float | None = None  # requests waiting, summed over the service's pods
    num_running: float | None = None  # requests running, summed
    ttft_p95_seconds: float | None = None  # None also when no first token was produced in the window
    request_rate: float | None = None  # first tokens per second over the window
    num_pods_reporting: int | None = None
    error: str | None = None  # why the source could not measure
    usage: ReplicaUsage | None = None  # the replicas' steps and request lengths over the window (calibration)
    recent_request_rate: float | None = None  # first tokens per second over the last few seconds (recent_arrivals)
    itl_p95_seconds: float | None = None   # a decode pool's inter-token latency P95 (spec.disaggregation only)
    kv_cache_usage: float | None = None    # a decode pool's KV cache use, mean over its pods (0-1; the same)

    @property
    def available(self) -> bool:
        return self.error is None and self.queue_depth is not None and math.isfinite(self.queue_depth)

    @property
    def has_traffic(self) -> bool:
        return any(v is not None and v > 0 for v in (self.queue_depth, self.num_running, self.request_rate))

    @classmethod
    def missing(cls, error: str, timestamp: float) -> Signals:
        return cls(timestamp=timestamp, error=error)

    def to_dict(self) -> dict[str, Any]:
        return {"timestamp": rfc3339_precise(self.timestamp), "queueDepth": self.queue_depth, "numRunning": self.num_running,
                "ttftP95Seconds": self.ttft_p95_seconds, "requestRate": self.request_rate,
                "recentRequestRate": self.recent_request_rate, "numPodsReporting": self.num_pods_reporting,
                "error": self.error,
                **({"itlP95Seconds": self.itl_p95_seconds} if self.itl_p95_seconds is not None else {}),
                **({"kvCacheUsage": self.kv_cache_usage} if self.kv_cache_usage is not None else {})}


@dataclass(frozen=True)
class ReplicaCounts:
    """`current` is spec.replicas now; `ready` counts pods that are ready and older than
    initialDelaySeconds; `pending` the others (scheduled, pulling, loading)."""

    current: int
    ready: int
    pending: int = 0

    def __post_init__(self) -> None:
        assert self.current >= 0 and self.ready >= 0 and self.pending >= 0

    @classmethod
    def from_pods(cls, current: int, pods: list[tuple[bool, float]], initial_delay_seconds: float) -> ReplicaCounts:
        """pods: (is_ready, age_seconds) of each pod of the service."""
        ready = sum(1 for is_ready, age in pods if is_ready and age >= initial_delay_seconds)
        return cls(current=current, ready=ready, pending=len(pods) - ready)
