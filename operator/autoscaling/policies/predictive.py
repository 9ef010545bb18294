"""The predictive autoscaling policy: replicas ordered one cold start ahead of the forecast need, released by
expected cost. Pure: the caller brings the observation, the state it kept, and the replica model's sizing.

- **Need.** A `Sizing`: the fleet a steady arrival rate needs within the TTFT target, and the rate a fleet serves,
  from the calibrated replica model (in the simulator the table that sizes the clairvoyant limit; `PerReplicaSizing`
  from a throughput per replica).
- **Up.** The forecast's upper value over the next cold start (`Forecast.high`), plus what drains the queue at
  hand within that time: a replica ordered now is ready when the forecast says it is needed. On a significant rise
  the order also leads the recent rate by its climb since the last pass (a 10 s count reads a step at half its
  height); the forecaster never keeps that lead.
- **Down, by expected cost.** Releasing a replica the need wants again costs a re-order (one cold start billed, and
  the requests that miss their target while it starts: `reorder_cost_cold_starts` cold starts of a replica's time);
  keeping it costs the time it idles until then, learned from how soon the need came back after its earlier falls
  (`return_gap`). So a replica is kept while the upper forecast over one cold start still needs it; beyond that,
  once the need has stayed below the fleet for `confirm_down_s`, the fleet is released a step
  (`max_scale_down_step`) every pass; where the need came back sooner than a re-order costs, a fall is held for as
  long as a re-order costs (the fleet is all there when the need returns within the gaps seen), then released a
  step per confirmation.
- **Guards.** Pending replicas count as capacity (the caller's `current` includes them); a missing observation
  never scales down; past `max_flaps_per_hour` direction changes in an hour, a release waits until the need has
  been below the fleet for as long as a re-order costs (never longer: a guard that held the fleet for the rest of
  the hour kept 20 replicas for 40 minutes on the public Azure code trace); min/max replicas hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

from kubeinfer.operator.autoscaling.policies.forecast import Forecast, ForecastConfig, update
from kubeinfer.operator.autoscaling.policies.return_gap import ReturnGap


class Sizing(Protocol):
    def replicas_for(self, rate: float) -> int:
        """The fleet a steady arrival rate (requests/s) needs."""

    def capacity(self, replicas: int) -> float:
        """The highest steady arrival rate `replicas` serve."""


@dataclass(frozen=True)
class PerReplicaSizing:
    """Every replica serves `rate_per_replica` requests/s (spec throughputPerReplica, or one measured)."""
    rate_per_replica: float

    def replicas_for(self, rate: float) -> int:
        return max(1, math.ceil(rate / self.rate_per_replica))

    def capacity(self, replicas: int) -> float:
        return replicas * self.rate_per_replica


@dataclass(frozen=True)
class StaffedSizing:
    """The reactive policy's steady-state sizing (square-root staffing): an offered load of R replicas' saturated
    throughput takes R + headroom x sqrt(R) replicas, so that the fleet does not run at its TTFT cliff. The
    operator's sizing: `rate_per_replica` is the learned saturated throughput (or spec throughputPerReplica)."""
    rate_per_replica: float
    headroom: float = 0.4

    def replicas_for(self, rate: float) -> int:
        offered = max(0.0, rate) / self.rate_per_replica
        return max(1, math.ceil(offered + self.headroom * math.sqrt(offered) - 1e-9))

    def capacity(self, replicas: int) -> float:
        root = (-self.headroom + math.sqrt(self.headroom ** 2 + 4 * max(replicas, 0))) / 2   # R + h sqrt(R) = n
        return root * root * self.rate_per_replica


@dataclass(frozen=True)
class PredictiveConfig:
    min_replicas: int
    max_replicas: int
    k_spread: float = 1.0               # spreads above the mean forecast provisioned for
    drain_s: float = 20.0               # a backlog is to be served within this long once the replicas are up
    queue_per_replica: float = 4.0      # waiting requests a replica holds in normal running (not a backlog)
    confirm_down_s: float = 30.0        # how long the need stays below the fleet before a release
    reorder_cost_cold_starts: float = 8.0   # a release the need wants back costs this many cold starts of a replica
    rise_lead_s: float = 10.0           # on a significant rise, orders lead the recent rate by this much of its climb
    max_scale_down_step: int = 1
    max_flaps_per_hour: int = 12
    forecast: ForecastConfig = ForecastConfig()


@dataclass(frozen=True)
class PredictiveState:
    forecast: Forecast = Forecast()
    below_since: float | None = None
    last_direction: int = 0                       # +1 up, -1 down, 0 none yet
    direction_changes: tuple[float, ...] = ()     # when the direction flipped, within the last hour
    return_gap: ReturnGap = ReturnGap()           # how soon the need came back after its falls

    def to_dict(self) -> dict:
        return {"forecast": self.forecast.to_dict(), "belowSince": self.below_since,
                "lastDirection": self.last_direction, "directionChanges": list(self.direction_changes),
                "returnGap": self.return_gap.to_dict()}

    @classmethod
    def from_dict(cls, data: dict | None) -> PredictiveState:
        if not data:
            return cls()
        return cls(Forecast.from_dict(data.get("forecast")), data.get("belowSince"), data.get("lastDirection", 0),
                   tuple(data.get("directionChanges", ())), ReturnGap.from_dict(data.get("returnGap")))


@dataclass(frozen=True)
class PredictiveDecision:
    desired_replicas: int
    reason: str
    state: PredictiveState = field(default_factory=PredictiveState)


def decide(observed_rate: float | None, queue_depth: float | None, current: int, state: PredictiveState,
           config: PredictiveConfig, cold_start_s: float, now: float, sizing: Sizing,
           rate_window_s: float = 30.0, rise: bool = False) -> PredictiveDecision:
    """`observed_rate`: arrivals per second over the last `rate_window_s` (None: no metrics); `queue_depth`:
    requests waiting; `current`: replicas asked for (ready and pending); `sizing`: fleets for steady rates (its
    table already holds the TTFT share under Poisson arrivals); `rise`: `observed_rate` is a significant rise
    (`recent_arrivals`), so the level takes it at once instead of smoothing towards it."""
    if observed_rate is None:
        return PredictiveDecision(current, "no metrics: holding", state)
    forecast = update(state.forecast, observed_rate, now, config.forecast)
    lead = 0.0
    if rise and observed_rate > forecast.level:
        forecast = replace(forecast, level=observed_rate)
        lead = _climb_lead(state.forecast, observed_rate, now, config.rise_lead_s)
    horizon = cold_start_s
    noise = math.sqrt(max(forecast.level, 0.0) / rate_window_s)   # a Poisson count's own spread, as a rate
    k = config.k_spread
    # The backlog when replicas ordered now are up (the queue at hand, plus what arrives beyond the fleet's
    # capacity meanwhile), to be served within `drain_s` on top of the arrivals: requests that arrive behind a
    # backlog wait for all of it, so a slow drain makes them late too.
    queue = max(0.0, (queue_depth or 0.0) - config.queue_per_replica * current)
    backlog_rate = 0.0
    if queue > 0:
        backlog = queue + max(0.0, forecast.level - sizing.capacity(current)) * horizon
        backlog_rate = backlog / config.drain_s
    # Up only past the estimate's own noise (hysteresis): at a rate on a fleet-size boundary, noise alone would
    # order and release a replica every minute.
    up_rate = max(0.0, forecast.high(horizon, k, noise) - noise) + backlog_rate
    keep_need = sizing.replicas_for(forecast.peak_over(horizon, k, noise) + backlog_rate)
    # The need's return is learned from the forecast's need: the lead's replicas are no need that came back.
    forecast_need = sizing.replicas_for(up_rate)
    gaps = state.return_gap.observe(now, current, keep_need, forecast_need, config.confirm_down_s)
    up_need = sizing.replicas_for(up_rate + lead) if lead else forecast_need
    reorder_s = config.reorder_cost_cold_starts * cold_start_s   # a re-order's cost, as seconds of a replica
    gradual = gaps.comes_back_within(reorder_s)
    desired, below_since = current, state.below_since
    if up_need > current:
        desired, below_since = up_need, None
        reason = f"forecast {forecast.high(horizon, k, noise):.2f} req/s in {horizon:.0f} s needs {up_need}"
        if lead:
            reason += f" (ordered for {lead:.2f} req/s more: the rate's climb since the last pass)"
    elif keep_need < current:
        below_since = now if below_since is None else below_since
        # Where the need came back sooner than a re-order costs, a fall is held for as long as a re-order costs:
        # keeping the fleet through a gap that short is cheaper than ordering it again, and a fall that lasts
        # longer is no such gap (then a step per confirmation).
        wait = reorder_s if gradual else config.confirm_down_s
        if now - below_since >= wait:
            desired = max(keep_need, current - config.max_scale_down_step)
            reason = (f"need {keep_need} for {now - below_since:.0f} s (forecast peak "
                      f"{forecast.peak_over(horizon, k, noise):.2f} req/s within a cold start); "
                      + (f"held {reorder_s:.0f} s, then a step per {config.confirm_down_s:.0f} s: the need came back "
                         f"{gaps.gap_s:.0f} s after a fall, sooner than a re-order costs" if gradual
                         else "a step every pass"))
        else:
            reason = f"need {keep_need} < {current} for {now - below_since:.0f} s; a release at {wait:.0f} s"
    else:
        below_since = None
        reason = f"need {keep_need}, fleet {current}: holding"
    desired = min(config.max_replicas, max(config.min_replicas, desired))
    direction = (desired > current) - (desired < current)
    changes = tuple(t for t in state.direction_changes if now - t < 3600.0)
    if direction and state.last_direction and direction != state.last_direction:
        # Never hold back a scale-up; hold a release only while the need has been below the fleet for less time
        # than a re-order costs (beyond that, keeping the replicas costs more than the flap they might save).
        if len(changes) >= config.max_flaps_per_hour and direction < 0 and now - below_since < reorder_s:
            return PredictiveDecision(current, f"{len(changes)} direction changes this hour: holding until the need "
                                      f"has been below the fleet for {reorder_s:.0f} s (a re-order's cost)",
                                      PredictiveState(forecast, below_since, state.last_direction, changes, gaps))
        changes += (now,)
    last = direction or state.last_direction
    if direction < 0 and gradual:   # the fall was held its re-order's cost: the next step a confirmation later
        below_since = now - (reorder_s - config.confirm_down_s)
    return PredictiveDecision(desired, reason, PredictiveState(forecast, below_since, last, changes, gaps))


def _climb_lead(before: Forecast, observed_rate: float, now: float, lead_s: float) -> float:
    """How far a rising rate is ordered for beyond its observation: `lead_s` of its climb since the last pass, at
    most the climb itself. Only the order takes it, never the forecaster's state: a level set above its
    observation would make the next error, the spread and the trend (which the horizon multiplies) large."""
    if before.updated_at is None or now <= before.updated_at:
        return 0.0
    climb = max(0.0, observed_rate - before.level)
    return min(climb, lead_s * climb / (now - before.updated_at))
