"""Data types of the policies: their config, the history they keep between decisions (serialisable, so the operator
can keep it in the InferenceService status and a restarted operator resumes from it), and their decision. What they
decide from (`Signals`, `ReplicaCounts`) is the signals room's (`signals.measured`).

Everything here is a frozen dataclass; the reactive policy itself lives in `reactive`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubeinfer.operator.times import rfc3339_precise, unix

# camelCase key of `spec.autoscaling` (docs/contracts.md) -> PolicyConfig field.
_SPEC_KEYS: dict[str, str] = {
    "minReplicas": "min_replicas",
    "maxReplicas": "max_replicas",
    "targetQueueDepthPerReplica": "target_queue_depth_per_replica",
    "targetTTFTP95Seconds": "target_ttft_p95_seconds",
    "metricWindowSeconds": "metric_window_seconds",
    "scaleUpStabilizationSeconds": "scale_up_stabilization_seconds",
    "scaleDownStabilizationSeconds": "scale_down_stabilization_seconds",
    "maxScaleUpStep": "max_scale_up_step",
    "maxScaleDownStep": "max_scale_down_step",
    "scaleToZeroIdleSeconds": "scale_to_zero_idle_seconds",
    "initialDelaySeconds": "initial_delay_seconds",
    "tolerance": "tolerance",
    "throughputPerReplica": "assumed_throughput_per_replica",
    # The decode pool of spec.disaggregation only (its autoscaling has them).
    "targetKvCacheUsage": "target_kv_cache_usage",
    "targetITLP95Seconds": "target_itl_p95_seconds",
}

MAX_EVENTS = 10


def _stamp(ts: float | None) -> str | None:
    return None if ts is None else rfc3339_precise(ts)


def _time(value: str | float) -> float:
    found = unix(value)
    assert found is not None, "a time in the scaling history is empty"
    return found


@dataclass(frozen=True)
class PolicyConfig:
    """`spec.autoscaling` (defaults as in docs/contracts.md) plus operator-level knobs that the spec
    does not expose (stale_after_seconds, max_ttft_scale_up_ratio, assumed_capacity_per_replica,
    headroom, learned_cold_start_seconds, backlog_drain_seconds)."""

    max_replicas: int
    min_replicas: int = 1
    target_queue_depth_per_replica: float = 4.0
    target_ttft_p95_seconds: float = 0.5
    metric_window_seconds: int = 60
    scale_up_stabilization_seconds: int = 0
    scale_down_stabilization_seconds: int = 300
    max_scale_up_step: int = 4
    max_scale_down_step: int = 1
    scale_to_zero_idle_seconds: int = 600
    initial_delay_seconds: int = 120
    tolerance: float = 0.1
    # Signals older than this are stale: the policy holds the current count.
    stale_after_seconds: float = 90.0
    # TTFT is not linear in replicas; one TTFT-driven decision at most multiplies the ready count by this.
    max_ttft_scale_up_ratio: float = 2.0
    # Concurrent requests one replica serves before queueing, used before the policy has measured it
    # (None: unknown until the fleet has been seen saturated once).
    assumed_capacity_per_replica: float | None = None
    # Requests per second one replica serves when saturated (spec throughputPerReplica), used until the
    # policy has measured it (None: unknown until the fleet has been seen busy for a whole window).
    assumed_throughput_per_replica: float | None = None
    # Square-root staffing coefficient: for an offered load of R = arrival rate / saturation throughput
    # (in replicas), steady-state sizing plans R + headroom * sqrt(R) replicas. Latency climbs steeply
    # near saturation (the TTFT "cliff") and a small fleet needs relatively more spare than a large one.
    headroom: float = 0.4
    # Pod creation -> Ready as the operator measured it on this service's pods (cold_start);
    # replaces initialDelaySeconds as the horizon over which an overload's queue growth is projected.
    learned_cold_start_seconds: float | None = None
    # Under overload with a known throughput per replica, the backlog is to be drained within this long once the
    # replicas counted for it serve (`drain_sizing`; the predictive policy's drain_s, so both answer it alike).
    backlog_drain_seconds: float = 20.0
    # A replica's batch cap and prefill token budget (spec.runtime maxNumSeqs, maxNumBatchedTokens), for the
    # replica model the predictive policy calibrates (None: the model's defaults).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # A decode pool's targets (spec.disaggregation.decode.autoscaling; None: no such rule, as for a colocated fleet).
    target_kv_cache_usage: float | None = None
    target_itl_p95_seconds: float | None = None

    def __post_init__(self) -> None:
        assert self.min_replicas >= 0, "minReplicas must be >= 0"
        assert self.max_replicas >= 1, "maxReplicas must be >= 1"
        assert self.min_replicas <= self.max_replicas, "minReplicas must be <= maxReplicas"
        assert self.target_queue_depth_per_replica > 0, "targetQueueDepthPerReplica must be > 0"
        assert self.target_ttft_p95_seconds > 0, "targetTTFTP95Seconds must be > 0"
        assert self.max_scale_up_step >= 1 and self.max_scale_down_step >= 1
        assert 0 <= self.tolerance < 1, "tolerance must be in [0, 1)"
        assert self.metric_window_seconds > 0 and self.stale_after_seconds > 0
        assert min(self.scale_up_stabilization_seconds, self.scale_down_stabilization_seconds,
                   self.scale_to_zero_idle_seconds, self.initial_delay_seconds) >= 0
        assert self.max_ttft_scale_up_ratio > 1
        assert self.headroom >= 0, "headroom must be >= 0"
        assert self.learned_cold_start_seconds is None or self.learned_cold_start_seconds >= 0
        assert self.backlog_drain_seconds > 0, "backlog_drain_seconds must be > 0"

    @property
    def cold_start_seconds(self) -> float:
        """How long a replica ordered now takes to serve: learned when measured, else the spec's guess."""
        if self.learned_cold_start_seconds is not None:
            return self.learned_cold_start_seconds
        return float(self.initial_delay_seconds)

    @classmethod
    def from_spec(cls, autoscaling: Any, **overrides: Any) -> PolicyConfig:
        """Build from the spec's pydantic `autoscaling` model or a plain dict with its camelCase keys.
        Unknown keys are ignored (the spec may grow); `overrides` set the operator-level fields."""
        if hasattr(autoscaling, "model_dump"):
            data = autoscaling.model_dump(by_alias=True, exclude_none=True)
        elif isinstance(autoscaling, Mapping):
            data = dict(autoscaling)
        else:
            raise TypeError(f"cannot build PolicyConfig from {type(autoscaling).__name__}")
        kwargs = {name: data[key] for key, name in _SPEC_KEYS.items() if key in data and data[key] is not None}
        if "max_replicas" not in kwargs:
            raise ValueError("spec.autoscaling.maxReplicas is required")
        return cls(**{**kwargs, **overrides})


@dataclass(frozen=True)
class ScaleEvent:
    time: float
    from_replicas: int
    to_replicas: int
    reason: str


@dataclass(frozen=True)
class ScaleHistory:
    """State the policy carries between decisions. Kept small: the recommendations of the longest
    stabilization window, the last few scale events, and a handful of scalars."""

    started_at: float | None = None  # first decision of this history (a fresh one never scales down early)
    # Runs of equal recommendations, oldest first, as (time, recommended replicas, 1 if made under overload
    # else 0): an overload recommendation holds scale-down for one metric window, a steady one for the
    # scale-down window. A run's time is the last pass that made it, except the newest run's, which is the
    # pass that began it: the newest is still being made, until `recommended_until`.
    recommendations: tuple[tuple[float, int, int], ...] = ()
    # (signal time, waiting, running, ready replicas) over the last metric window: the arrival rate, and
    # whether the fleet was busy enough to measure its throughput
    queue_samples: tuple[tuple[float, float, float, int], ...] = ()
    events: tuple[ScaleEvent, ...] = ()
    last_traffic_time: float | None = None
    last_scale_time: float | None = None
    capacity_per_replica: float | None = None  # running requests per ready replica when last seen saturated
    throughput_per_replica: float | None = None  # requests/s one replica served, saturated for a whole window
    last_ready: int | None = None
    ready_changed_at: float | None = None
    # (arrival rate in req/s, recommended replicas, seconds the rate was measured over) of the last scale-up, by a
    # rule that sized for an arrival rate; None after any other: while its replicas are pending, more only for a
    # higher rate (`pending_guard`)
    scale_up_sized_for: tuple[float, int, float] | None = None
    # The last pass that made the newest recommendation run. Not kept in status (it moves at every pass): read
    # back, None, or the latest time the previous pass can have been (`history_status.history_for`).
    recommended_until: float | None = None

    def recommended_in_window(self, now: float) -> tuple[tuple[float, int, int], ...]:
        """(last time made, replicas, overload) of every run, the newest made at `now`, the pass deciding."""
        if not self.recommendations:
            return ()
        return self.recommendations[:-1] + ((now, *self.recommendations[-1][1:]),)

    def to_dict(self) -> dict[str, Any]:
        """The history as kept in status; every time in it is RFC 3339 (`times.rfc3339_precise`).
        `recommended_until` is left out: it moves at every pass, and a status that moves at every pass is
        written at every pass."""
        return {
            "startedAt": _stamp(self.started_at),
            "recommendations": [[rfc3339_precise(t), n, o] for t, n, o in self.recommendations],
            "queueSamples": [[rfc3339_precise(t), *rest] for t, *rest in self.queue_samples],
            "events": [{"time": rfc3339_precise(e.time), "from": e.from_replicas, "to": e.to_replicas,
                        "reason": e.reason} for e in self.events],
            "lastTrafficTime": _stamp(self.last_traffic_time),
            "lastScaleTime": _stamp(self.last_scale_time),
            "capacityPerReplica": self.capacity_per_replica,
            "throughputPerReplica": self.throughput_per_replica,
            "lastReady": self.last_ready,
            "readyChangedAt": _stamp(self.ready_changed_at),
            "scaleUpSizedFor": None if self.scale_up_sized_for is None else
            dict(zip(("arrivalRate", "replicas", "spanSeconds"), self.scale_up_sized_for)),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ScaleHistory:
        """Tolerant: a missing or partial dict gives a (partly) fresh history. Times may be RFC 3339 or the
        epoch numbers of an older operator."""
        if not data:
            return cls()
        return cls(
            started_at=unix(data.get("startedAt")),
            recommendations=tuple((_time(r[0]), int(r[1]), int(r[2]) if len(r) > 2 else 0)
                                  for r in data.get("recommendations") or ()),
            queue_samples=tuple((_time(t), float(q), float(n), int(r)) for t, q, n, r in data.get("queueSamples") or ()),
            events=tuple(ScaleEvent(_time(e["time"]), int(e["from"]), int(e["to"]), str(e["reason"]))
                         for e in data.get("events") or ()),
            last_traffic_time=unix(data.get("lastTrafficTime")),
            last_scale_time=unix(data.get("lastScaleTime")),
            capacity_per_replica=data.get("capacityPerReplica"),
            throughput_per_replica=data.get("throughputPerReplica"),
            last_ready=data.get("lastReady"),
            ready_changed_at=unix(data.get("readyChangedAt")),
            scale_up_sized_for=_sized_for(data.get("scaleUpSizedFor")),
        )

    def with_event(self, event: ScaleEvent) -> ScaleHistory:
        return replace(self, events=(self.events + (event,))[-MAX_EVENTS:], last_scale_time=event.time)


def _sized_for(data: Mapping[str, Any] | None) -> tuple[float, int, float] | None:
    if not data or any(data.get(k) is None for k in ("arrivalRate", "replicas", "spanSeconds")):
        return None
    return float(data["arrivalRate"]), int(data["replicas"]), float(data["spanSeconds"])


@dataclass(frozen=True)
class ScaleDecision:
    desired_replicas: int
    reason: str  # a constant CamelCase word, fit for an Event reason
    message: str  # one human line, fit for an Event message
    history: ScaleHistory = field(default_factory=ScaleHistory)
    recommendation: int | None = None  # what the signals asked for before stabilization and rate limits
