"""The fleet a steady arrival rate needs within the TTFT target, measured on the replica model. Pure.

For n = 1, 2, ... replicas, the rate grid (RATE_STEP) is walked up from where n - 1 replicas stopped, each point a
steady Poisson run of a fixed, ready fleet (`replica_model.steady_share`; 5 minutes, or 600 requests with a
service's own lengths, since a few long prompts among 75 would swing the share by points). A fleet serves a rate
when the share of first tokens within the target reaches the sizing share.

- `fleet_sizing`: the whole table up to a rate (the simulator's clairvoyant limit and fixed fleet).
- `ModelSizing`: the same walk, done only as far as a question needs and cached per model (the operator's
  predictive policy: its `Sizing`); a question walks at most WALK_BUDGET new rates, the fleet for a rate beyond
  is found by a few runs at that rate, and the capacity of a fleet beyond the walk is extrapolated, not walked.
- `sizing_share`: 99% of the requests, but 2 points below the share an idle replica can answer in time where
  long prompts alone take longer than the target (no fleet does better; sizing for 99% would bound nothing).

With an ITL target (`autoscaling.targetITLP95Seconds`) a fleet serves a rate only if 95% of the tokens after the
first also come within it: each decoding sequence waits its replica's whole step, and a step that admits prompts
is a long one, so fewer sequences and fewer admissions per replica (a larger fleet) shorten them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from bisect import bisect_left
from dataclasses import dataclass

from kubeinfer.operator.autoscaling.sizing.replica_model import Lengths, ReplicaModel, steady_requests, steady_shares

RATE_STEP = 0.25      # requests/s between the rates at which a fleet is measured (rounded up: conservative)
DRAIN_CAP_S = 900.0   # a request not served this long after a run's end is a miss
SHARE, MARGIN = 0.99, 0.02
SEED = 7
MAX_RATE = 1000.0     # requests/s: no fleet is walked further
WALK_BUDGET = 8       # grid rates one question of the predictive policy may walk (each a run of 0.05-0.6 s CPU)
ITL_SHARE = 0.95      # with an ITL target: the share of tokens after the first within it (the target is a P95)


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
           lengths: Lengths = None, itl_target_s: float | None = None) -> bool:
    """`replicas` hold `share` of first tokens within the TTFT target at `rate`, and with an ITL target
    ITL_SHARE of the later tokens within it."""
    duration = run_seconds(rate, lengths)
    requests = steady_requests(rate, duration, lengths, seed)
    ttft, itl = steady_shares(replicas, requests, ttft_target_s, model, duration + DRAIN_CAP_S, itl_target_s)
    return ttft >= share and itl >= ITL_SHARE


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
    limit = max_rate + RATE_STEP
    rates: list[float] = []
    while len(rates) < max_replicas:   # read off the walk (which other questions may have taken further)
        n = len(rates)
        if n < len(walk.max_rates) and walk.max_rates[n] + RATE_STEP <= limit:
            rates.append(walk.max_rates[n])   # failed within the limit
        elif n == len(walk.max_rates) and walk.rate <= limit:
            walk.advance(limit)
        else:   # still serving past the limit: the table stops there, at the last grid rate within it
            rates.append((math.floor(limit / RATE_STEP + 1e-9) + 1) * RATE_STEP - RATE_STEP)
            break
    return FleetSizing(tuple(rates))


class _Walk:
    """The table walk, kept between questions: `max_rates` of the fleets done, and the next rate to try on the
    next fleet (it serves every grid rate below it)."""

    def __init__(self, ttft_target_s: float, model: ReplicaModel, share: float, seed: int, lengths: Lengths,
                 itl_target_s: float | None = None):
        self.args = (ttft_target_s, model, share, seed, lengths, itl_target_s)
        self.max_rates: list[float] = []
        self.rate = RATE_STEP
        self.ahead: dict[float, int] = {}   # grid rate past the walk -> the smallest fleet that serves it

    def advance(self, until_rate: float) -> None:
        """Walks the open fleet up to `until_rate`, or to the rate it fails (which closes it)."""
        target, model, share, seed, lengths, itl_target = self.args
        n = len(self.max_rates) + 1
        while self.rate <= until_rate:
            if not serves(n, self.rate, target, model, share, seed, lengths, itl_target):
                self.max_rates.append(self.rate - RATE_STEP)
                return
            self.rate += RATE_STEP


def _per_replica(walk: _Walk) -> float:
    """The best rate per replica the walk has shown (the open fleet serves at least the rates it passed)."""
    known = [*walk.max_rates, walk.rate - RATE_STEP]
    return max(rate / n for n, rate in enumerate(known, start=1))


@functools.lru_cache(maxsize=64)
def _walk(ttft_target_s: float, model: ReplicaModel, share: float, seed: int, lengths: Lengths,
          max_replicas: int, itl_target_s: float | None = None) -> _Walk:
    return _Walk(ttft_target_s, model, share, seed, lengths, itl_target_s)


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
    itl_target_s: float | None = None   # autoscaling.targetITLP95Seconds: a fleet must also hold it

    def _walk(self) -> _Walk:
        return _walk(self.ttft_target_s, self.model, self.share, SEED, self.lengths, self.max_replicas,
                     self.itl_target_s)

    def replicas_for(self, rate: float) -> int:
        """The table's answer; once a question has walked WALK_BUDGET new grid rates, the fleet for the rate itself
        (`_ahead`: a few runs at that rate, not the table up to it; the next questions walk on from there)."""
        if rate <= 0:
            return 1
        walk = self._walk()
        budget = WALK_BUDGET
        while True:
            done = bisect_left(walk.max_rates, rate)
            if done < len(walk.max_rates):
                return done + 1
            if done >= self.max_replicas:
                return self.max_replicas + 1
            if walk.rate - RATE_STEP >= rate:   # the open fleet serves it already
                return done + 1
            per_replica = _per_replica(walk)
            if budget <= 0 and per_replica > 0:
                most = min(self.max_replicas + 1, max(done + 1, math.ceil(rate / per_replica - 1e-9)))
                return self._ahead(walk, rate, done + 1, most)
            walk.advance(walk.rate)   # one grid rate
            budget -= 1

    def _ahead(self, walk: _Walk, rate: float, least: int, most: int) -> int:
        """The smallest fleet in [least, most] that serves `rate` (rounded up to the grid), by bisection over runs at
        that rate: `most` serves it at the best rate per replica known, and a larger fleet serves more per replica.
        Past the walk, a burst asks for rates the table has not reached: extrapolating from the small fleets walked
        so far (which pool less) would order up to twice the fleet; 3-4 runs answer it, and are kept."""
        grid = math.ceil(rate / RATE_STEP - 1e-9) * RATE_STEP
        if grid not in walk.ahead:
            target, model, share, seed, lengths, itl_target = walk.args
            while least < most:
                mid = (least + most) // 2
                if serves(mid, grid, target, model, share, seed, lengths, itl_target):
                    most = mid
                else:
                    least = mid + 1
            walk.ahead[grid] = most
        return walk.ahead[grid]

    def capacity(self, replicas: int) -> float:
        """The table's rate for a fleet walked already; beyond, the best rate per replica known so far times the
        fleet (the policy asks it of the fleet at hand, which a burst makes large: walking the table that far
        would cost minutes of CPU for one backlog estimate)."""
        if replicas <= 0:
            return 0.0
        walk = self._walk()
        if replicas <= len(walk.max_rates):
            return walk.max_rates[replicas - 1]
        while True:
            per_replica = _per_replica(walk)
            if per_replica > 0 or len(walk.max_rates) >= self.max_replicas:
                return per_replica * replicas
            walk.advance(MAX_RATE)
