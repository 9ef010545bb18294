"""A forecaster of the arrival rate over the next cold start: Holt's linear trend (double exponential smoothing)
with a running spread of its one-step errors, updated online in O(1) per observation.

Irregular observation times are handled by discounting per second (`alpha_per_s` is the weight a one-second-old
level keeps). `high(h)` is the larger of the level and the forecast at h seconds, plus `k` spreads beyond the observations'
own sampling noise (a count of Poisson arrivals over a window varies by itself; that is no change of demand):
the rate to provision for. A burst's first observations raise the spread as fast as the level. The state is a small
dict, so the operator can keep it in the InferenceService status and a restarted operator resumes from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Forecast:
    level: float = 0.0           # requests/s now
    trend: float = 0.0           # requests/s per second
    spread: float = 0.0          # smoothed absolute one-step error, requests/s
    updated_at: float | None = None

    def at(self, horizon_s: float) -> float:
        """The mean forecast `horizon_s` seconds after the last update (never below 0)."""
        return max(0.0, self.level + self.trend * horizon_s)

    def high(self, horizon_s: float, k: float = 1.0, noise: float = 0.0) -> float:
        """The rate to provision for: the larger of the level and the horizon's forecast, plus k spreads beyond
        `noise` (the observations' own sampling spread)."""
        return max(self.level, self.at(horizon_s)) + k * max(0.0, self.spread - noise)

    def peak_over(self, horizon_s: float, k: float = 1.0, noise: float = 0.0) -> float:
        """The highest upper forecast over [0, horizon_s] (linear: at an end)."""
        return max(self.high(0.0, k, noise), self.high(horizon_s, k, noise))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Forecast:
        return cls(**data) if data else cls()


@dataclass(frozen=True)
class ForecastConfig:
    level_half_life_s: float = 10.0     # how fast the level follows the observations
    trend_half_life_s: float = 60.0     # how fast the trend does (slower: one noisy point is not a trend)
    spread_half_life_s: float = 120.0   # how long a surprise keeps the upper forecast up


def _weight(half_life_s: float, dt: float) -> float:
    """The weight a new observation gets after `dt` seconds, for a memory of `half_life_s`."""
    return 1.0 - math.pow(0.5, dt / half_life_s)


def update(forecast: Forecast, observed_rate: float, now: float, config: ForecastConfig = ForecastConfig()) -> Forecast:
    """The forecast after observing `observed_rate` at `now`."""
    if forecast.updated_at is None:
        return Forecast(observed_rate, 0.0, 0.0, now)
    dt = now - forecast.updated_at
    if dt <= 0:
        return forecast
    predicted = forecast.at(dt)
    error = observed_rate - predicted
    a, b, s = (_weight(config.level_half_life_s, dt), _weight(config.trend_half_life_s, dt),
               _weight(config.spread_half_life_s, dt))
    level = predicted + a * error
    trend = (1 - b) * forecast.trend + b * (level - forecast.level) / dt
    spread = forecast.spread + max(s, a if error > 0 else 0.0) * (abs(error) - forecast.spread)
    return Forecast(max(0.0, level), trend, max(0.0, spread), now)
