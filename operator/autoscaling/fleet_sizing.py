"""The fleet a steady arrival rate needs within the TTFT target, measured on the replica model. Pure.

For n = 1, 2, ... replicas, the rate grid (RATE_STEP) is walked up from where n - 1 replicas stopped, each point a
steady Poisson run of a fixed, ready fleet (`replica_model.steady_share`; 5 minutes, or 600 requests with a
service's own lengths, since a few long prompts among 75 would swing the share by points). A fleet serves a rate
when the share of first tokens within the target reaches the sizing share.

- `fleet_sizing`: the whole table up to a rate (the simulator's clairvoyant limit and fixed fleet).
- `ModelSizing`: the same walk, done only as far as a question needs and cached per model (the operator's
  predictive policy: its `Sizing`).
- `sizing_share`: 99% of the requests, but 2 points below the share an idle replica can answer in time where
  long prompts alone take longer than the target (no fleet does better; sizing for 99% would bound nothing).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from bisect import bisect_left
from dataclasses import dataclass

from kubeinfer.operator.autoscaling.replica_model import Lengths, ReplicaModel, steady_requests, steady_share

RATE_STEP = 0.25      # requests/s between the rates at which a fleet is measured (rounded up: conservative)
DRAIN_CAP_S = 900.0   # a request not served this long after a run's end is a miss
SHARE, MARGIN = 0.99, 0.02
SEED = 7
MAX_RATE = 1000.0     # requests/s: no fleet is walked further


def run_seconds(rate: float, lengths: Lengths) -> float:
    return 300.0 if lengths is None else max(300.0, 600.0 / rate)


def attainable_share(lengths: Lengths, ttft_target_s: float, model: ReplicaModel) -> float:
    """Share of requests an idle replica answers within the target (one step: its prefill and a decode's base)."""
    if not lengths:
        return 1.0
    return sum(1 for prompt, _ in lengths if model.alone_seconds(prompt) <= ttft_target_s) / len(lengths)


def sizing_share(lengths: Lengths, ttft_target_s: float, model: ReplicaModel, share: float = SHARE) -> float:
    """The share fleets are sized for: `share` with log-normal lengths; with a service's own, 2 points below the
    attainable share, and never above `share`."""
    if lengths is None:
        return share
    return min(share, attainable_share(lengths, ttft_target_s, model) - MARGIN)


def serves(replicas: int, rate: float, ttft_target_s: float, model: ReplicaModel, share: float, seed: int = SEED,
           lengths: Lengths = None) -> bool:
    duration = run_seconds(rate, lengths)
    requests = steady_requests(rate, duration, lengths, seed)
    return steady_share(replicas, requests, ttft_target_s, model, duration + DRAIN_CAP_S) >= share


@dataclass(frozen=True)
class FleetSizing:
    """`max_rates[n - 1]`: the highest rate (on the RATE_STEP grid) that n replicas serve steadily with the
    sizing share of TTFTs within target; nondecreasing in n."""

    max_rates: tuple[float, ...]

    def replicas_for(self, rate: float) -> int:
        """Smallest fleet that serves `rate`; the largest measured fleet beyond the table."""
        if rate <= 0:
            return 1
        return min(len(self.max_rates), bisect_left(self.max_rates, rate) + 1)


@functools.lru_cache(maxsize=None)
def fleet_sizing(ttft_target_s: float, model: ReplicaModel, max_replicas: int, max_rate: float,
                 share: float = SHARE, seed: int = SEED, lengths: Lengths = None) -> FleetSizing:
    """The table for fleets of 1 to `max_replicas`, up to `max_rate`. A fleet that starts ready has no cold start:
    it is left out of the model (and of the cache key)."""
    model = dataclasses.replace(model, cold_start_s=0.0)
    walk = _walk(ttft_target_s, model, share, seed, lengths, max_replicas)
    while len(walk.max_rates) < max_replicas and walk.rate <= max_rate + RATE_STEP:
        walk.advance(max_rate + RATE_STEP)
    rates = walk.max_rates + ([walk.rate - RATE_STEP] if len(walk.max_rates) < max_replicas else [])
    return FleetSizing(tuple(rates[:max_replicas]))


class _Walk:
    """The table walk, kept between questions: `max_rates` of the fleets done, and the next rate to try on the
    next fleet (it serves every grid rate below it)."""

    def __init__(self, ttft_target_s: float, model: ReplicaModel, share: float, seed: int, lengths: Lengths):
        self.args = (ttft_target_s, model, share, seed, lengths)
        self.max_rates: list[float] = []
        self.rate = RATE_STEP

    def advance(self, until_rate: float) -> None:
        """Walks the open fleet up to `until_rate`, or to the rate it fails (which closes it)."""
        target, model, share, seed, lengths = self.args
        n = len(self.max_rates) + 1
        while self.rate <= until_rate:
            if not serves(n, self.rate, target, model, share, seed, lengths):
                self.max_rates.append(self.rate - RATE_STEP)
                return
            self.rate += RATE_STEP


@functools.lru_cache(maxsize=64)
def _walk(ttft_target_s: float, model: ReplicaModel, share: float, seed: int, lengths: Lengths,
          max_replicas: int) -> _Walk:
    return _Walk(ttft_target_s, model, share, seed, lengths)


@dataclass(frozen=True)
class ModelSizing:
    """The predictive policy's `Sizing` from a calibrated replica model and the service's request lengths: the
    table of `fleet_sizing`, measured only as far as asked (and cached: the same model asks nothing twice).
    Beyond `max_replicas`, one more than it (the policy clamps to the ceiling anyway)."""

    model: ReplicaModel
    lengths: tuple[tuple[int, int], ...]
    ttft_target_s: float
    share: float
    max_replicas: int

    def _walk(self) -> _Walk:
        return _walk(self.ttft_target_s, self.model, self.share, SEED, self.lengths, self.max_replicas)

    def replicas_for(self, rate: float) -> int:
        if rate <= 0:
            return 1
        walk = self._walk()
        grid = math.ceil(rate / RATE_STEP - 1e-9) * RATE_STEP   # the grid rate that must be shown served
        while True:
            done = bisect_left(walk.max_rates, rate)
            if done < len(walk.max_rates):
                return done + 1
            if done >= self.max_replicas:
                return self.max_replicas + 1
            if walk.rate - RATE_STEP >= rate:   # the open fleet serves it already
                return done + 1
            walk.advance(grid)

    def capacity(self, replicas: int) -> float:
        if replicas <= 0:
            return 0.0
        n = min(replicas, self.max_replicas)
        walk = self._walk()
        while len(walk.max_rates) < n:
            walk.advance(MAX_RATE)
            if len(walk.max_rates) < n and walk.rate > MAX_RATE:   # served all the way: closed at the cap
                walk.max_rates.append(walk.rate - RATE_STEP)
        return walk.max_rates[n - 1] * replicas / n
