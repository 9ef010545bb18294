"""The policies the simulator compares: ours (kubeinfer.operator.autoscaling.policies.reactive, fed Prometheus-like
signals), a fixed fleet, a KubeAI-style moving average of concurrency, and a Knative-KPA-style
stable/panic policy. The two baselines are written here from their public descriptions (KubeAI:
concurrency sampled every `interval`, averaged over `timeWindow`, divided by `targetRequests`, scale-down
after `scaleDownDelaySeconds`; KPA: concurrency averaged over a stable (60 s) and a panic (6 s) window,
panic when the panic recommendation reaches 2x the ready pods, no scale-down in panic, scale-down at
most 2x per tick); they are models of those designs, not their code.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field, replace

from kubeinfer.operator.autoscaling.policies import predictive as autoscale_predictive
from kubeinfer.operator.autoscaling.policies.predictive_pass import decide_predictive
from kubeinfer.operator.autoscaling.policies.reactive import decide
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.cold_start import ColdStartRecord
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts
from kubeinfer.operator.autoscaling.sizing import fleet_sizing

from .observation import Observation


@dataclass
class FixedFleet:
    replicas: int
    name: str = "fixed (peak-sized)"
    tick_s: float = 60.0

    def decide(self, obs: Observation) -> int:
        return self.replicas


@dataclass
class KubeInferPolicy:
    """Ours. The history goes through its JSON form at every tick, as it would through the status. With
    `learn_cold_start` it learns the cold start from the replicas it created, as the operator does from
    its pods (`kubeinfer.operator.autoscaling.signals.cold_start`), and uses it in place of initialDelaySeconds."""

    config: PolicyConfig
    tick_s: float = 5.0  # the operator's default KUBEINFER_AUTOSCALE_INTERVAL_SECONDS
    scrape_interval_s: float = 5.0
    name: str = "kubeinfer (queue + TTFT P95)"
    learn_cold_start: bool = True
    history: ScaleHistory = field(default_factory=ScaleHistory)
    cold_start: ColdStartRecord = field(default_factory=ColdStartRecord)
    reasons: list[str] = field(default_factory=list)

    def observe(self, obs: Observation):
        """(signals, config with the cold start learned so far) of this tick."""
        signals = obs.signals(self.scrape_interval_s, self.config.metric_window_seconds)
        if not self.learn_cold_start:
            return signals, self.config
        self.cold_start = self.cold_start.with_samples(obs.cold_starts())
        return signals, replace(self.config, learned_cold_start_seconds=self.cold_start.seconds)

    def decide(self, obs: Observation) -> int:
        signals, config = self.observe(obs)
        d = decide(signals, ReplicaCounts(obs.current, obs.ready, obs.pending), self.history, config, obs.now)
        self.history = ScaleHistory.from_dict(json.loads(json.dumps(d.history.to_dict())))
        self.reasons.append(d.reason)
        return d.desired_replicas


@dataclass
class OperatorPredictivePolicy(KubeInferPolicy):
    """Ours with `autoscaling.policy: predictive`, as the operator runs it (`predictive_pass`): the reactive pass
    first, then the forecast over its arrival rate, one learned cold start ahead, sized by the replica model it
    calibrates from the replicas' series (`Observation.signals(...).usage`, what the runtime exports), and until
    then by the throughput per replica (StaffedSizing). Both states go through their JSON form at every tick, as
    through the status."""

    name: str = "kubeinfer predictive (operator)"
    stored: dict | None = None
    calibration_log: list = field(default_factory=list)   # (time, what the calibration waits for; None: a model)
    arrivals_from: list = field(default_factory=list)   # per pass: "recent" or "window" (False: no recent rate)

    def __post_init__(self) -> None:
        # A fresh operator: its sizing tables (cached per calibrated model) start empty, so a run does not depend on
        # the runs before it. The clairvoyant's tables read the same walks whatever their progress.
        fleet_sizing._walk.cache_clear()

    def decide(self, obs: Observation) -> int:
        signals, config = self.observe(obs)
        counts = ReplicaCounts(obs.current, obs.ready, obs.pending)
        reactive = decide(signals, counts, self.history, config, obs.now)
        outcome = decide_predictive(reactive, self.history, signals, counts, self.stored, config, obs.now)
        self.history = ScaleHistory.from_dict(json.loads(json.dumps(outcome.decision.history.to_dict())))
        self.stored = json.loads(json.dumps(outcome.status))
        self.calibration_log.append((obs.now, None if self.stored.get("replicaModel")
                                     else self.stored.get("calibrationWaitsFor")))
        self.arrivals_from.append(signals.recent_request_rate is not None
                                  and (self.stored.get("forecast") or {}).get("arrivalRateFrom"))
        self.reasons.append(outcome.decision.reason)
        return outcome.decision.desired_replicas


@dataclass
class MovingAverageConcurrency:
    """KubeAI-style: ceil(moving average of in-flight requests / target per replica)."""

    target_per_replica: float
    min_replicas: int
    max_replicas: int
    tick_s: float = 10.0
    window_s: float = 600.0
    scale_down_delay_s: float = 30.0
    name: str = "KubeAI-style (moving avg)"
    _samples: deque = field(default_factory=deque)
    _lower_since: float | None = None

    def decide(self, obs: Observation) -> int:
        current_concurrency = obs.concurrency(1.0)
        self._samples.append(current_concurrency[-1] if current_concurrency else 0.0)
        while len(self._samples) > max(1, int(self.window_s / self.tick_s)):
            self._samples.popleft()
        avg = sum(self._samples) / len(self._samples)
        desired = min(self.max_replicas, max(self.min_replicas, math.ceil(avg / self.target_per_replica)))
        if desired >= obs.current:
            self._lower_since = None
            return desired
        if self._lower_since is None:
            self._lower_since = obs.now
        return desired if obs.now - self._lower_since >= self.scale_down_delay_s else obs.current


@dataclass
class StablePanic:
    """Knative-KPA-style: stable and panic windows over per-second concurrency."""

    target_per_replica: float
    min_replicas: int
    max_replicas: int
    tick_s: float = 2.0
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_down_rate: float = 2.0
    name: str = "KPA-style (stable/panic)"
    _panic_since: float | None = None
    _panic_floor: int = 0

    def decide(self, obs: Observation) -> int:
        stable = obs.concurrency(self.stable_window_s) or [0.0]
        panic = obs.concurrency(self.panic_window_s) or [0.0]
        want_stable = sum(stable) / len(stable) / self.target_per_replica
        want_panic = sum(panic) / len(panic) / self.target_per_replica
        ready = max(1, obs.ready)
        floor_rate = math.floor(ready / self.max_scale_down_rate)
        desired_stable = max(floor_rate, math.ceil(want_stable))
        desired_panic = max(floor_rate, math.ceil(want_panic))
        if want_panic / ready >= self.panic_threshold:
            self._panic_since = obs.now
        elif self._panic_since is not None and obs.now - self._panic_since > self.stable_window_s:
            self._panic_since, self._panic_floor = None, 0
        if self._panic_since is not None:
            desired = max(desired_panic, self._panic_floor, obs.current)  # never scale down in panic
            self._panic_floor = desired
        else:
            desired = desired_stable
        return min(self.max_replicas, max(self.min_replicas, desired))


@dataclass(frozen=True)
class TableSizing:
    """The table that sizes the limit (`clairvoyant.FleetSizing`), as the predictive policy's `Sizing`: past its
    largest fleet, at that fleet's rate per replica (the limit itself stops at the table)."""

    table: object   # clairvoyant.FleetSizing

    def _per_replica(self) -> float:
        return self.table.max_rates[-1] / len(self.table.max_rates)

    def replicas_for(self, rate: float) -> int:
        if rate <= self.table.max_rates[-1] or self.table.max_rates[-1] <= 0:
            return self.table.replicas_for(rate)
        return math.ceil(rate / self._per_replica())

    def capacity(self, replicas: int) -> float:
        if replicas <= 0:
            return 0.0
        if replicas <= len(self.table.max_rates):
            return self.table.max_rates[replicas - 1]
        return replicas * self._per_replica()


@dataclass
class PredictivePolicy:
    """Ours, predictive (autoscaling.policies.predictive): the arrival rate over the last 10 s into the
    forecaster, the fleet sized by the calibrated replica model (the table that sizes the limit), the cold start
    learned from the replicas it creates."""

    sizing: TableSizing
    config: autoscale_predictive.PredictiveConfig
    initial_cold_start_s: float = 60.0
    tick_s: float = 5.0
    rate_window_s: float = 10.0
    name: str = "kubeinfer predictive"
    state: autoscale_predictive.PredictiveState = field(default_factory=autoscale_predictive.PredictiveState)
    cold_start: ColdStartRecord = field(default_factory=ColdStartRecord)
    reasons: list[str] = field(default_factory=list)

    def decide(self, obs: Observation) -> int:
        from bisect import bisect_right
        arrivals = obs.sim.arrival_times
        seen = bisect_right(arrivals, obs.now) - bisect_right(arrivals, obs.now - self.rate_window_s)
        rate = seen / min(self.rate_window_s, max(obs.now, 1e-9))
        self.cold_start = self.cold_start.with_samples(obs.cold_starts())
        cold_start = self.cold_start.seconds or self.initial_cold_start_s
        waiting = obs.sim.samples.waiting[-1] if obs.sim.samples.waiting else 0.0
        d = autoscale_predictive.decide(rate, waiting, obs.current, self.state, self.config, cold_start, obs.now,
                                        self.sizing, self.rate_window_s)
        self.state = autoscale_predictive.PredictiveState.from_dict(json.loads(json.dumps(d.state.to_dict())))
        self.reasons.append(d.reason)
        return d.desired_replicas
