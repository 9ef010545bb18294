"""The clairvoyant limit: a policy that knows the whole trace and orders each replica exactly one cold
start before it is needed.

No autoscaler can do better for a given cold start without serving requests it cannot see coming,
so its SLO share and GPU-hours are the yardstick for ours (docs/benchmarks.md, the cold-start sweep).

- The fleet a rate needs comes from the simulator's own replica model (`FleetSizing`: the smallest
  fixed fleet that serves a steady rate with 99% of TTFTs within target, measured on the simulator
  exactly as the fixed fleet of the benchmark is sized), so capacity per replica is the same for
  every policy compared.
- At every tick it asks for the largest need over [now, now + cold start + tick]: a replica ordered now
  is ready at now + cold start, just in time for the rate it must serve then.
- It keeps a ready replica only while the need within one cold start says so, and releases it the
  moment the need falls otherwise: releasing and re-ordering later costs one cold start of billing,
  keeping it costs the gap, and the window picks the cheaper. Its GPU-hours are thus close to the
  least that serves the trace at that share.
"""

from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_left
from dataclasses import dataclass

from .scenarios import calibration_run, summarize
from .sim import Observation, ReplicaModel, Simulation, Trace

RATE_STEP = 0.25  # requests/s between the rates at which the sizing is measured (rounded up: conservative)


@dataclass(frozen=True)
class FleetSizing:
    """`max_rates[n - 1]`: the highest rate (on a RATE_STEP grid) that n replicas serve steadily with the
    share of TTFTs within target; nondecreasing in n."""

    max_rates: tuple[float, ...]

    def replicas_for(self, rate: float) -> int:
        """Smallest fleet that serves `rate`; the largest measured fleet beyond the table."""
        if rate <= 0:
            return 1
        return min(len(self.max_rates), bisect_left(self.max_rates, rate) + 1)


def _serves(replicas: int, rate: float, ttft_target_s: float, model: ReplicaModel, share: float, seed: int,
            lengths) -> bool:
    from .policies import FixedFleet

    sim = Simulation(calibration_run(rate, lengths), FixedFleet(replicas), initial_replicas=replicas, model=model,
                     seed=seed).run()
    return summarize(sim, ttft_target_s, warmup_s=0.0).slo_share >= share


@functools.lru_cache(maxsize=None)
def fleet_sizing(ttft_target_s: float, model: ReplicaModel, max_replicas: int, max_rate: float,
                 share: float = 0.99, seed: int = 7, lengths=None) -> FleetSizing:
    """Measured on the simulator (5-minute steady runs, a fixed fleet, as `scenarios.replicas_for_rate`):
    for n = 1, 2, ... the rate grid is walked up from where n - 1 replicas stopped. Requests are drawn from
    `lengths` (a replayed trace's own (prompt, output) pairs), so the sizing bounds that trace. The cold start
    does not matter to a fleet that starts ready, so it is left out of the cache key."""
    model = dataclasses.replace(model, cold_start_s=0.0)
    max_rates: list[float] = []
    rate = RATE_STEP
    for n in range(1, max_replicas + 1):
        while rate <= max_rate + RATE_STEP and _serves(n, rate, ttft_target_s, model, share, seed, lengths):
            rate += RATE_STEP
        max_rates.append(rate - RATE_STEP)
        if rate > max_rate + RATE_STEP:
            break
    return FleetSizing(tuple(max_rates))


@dataclass
class ClairvoyantPolicy:
    trace: Trace
    sizing: FleetSizing
    cold_start_s: float
    min_replicas: int = 1
    tick_s: float = 1.0
    resolution_s: float = 0.5  # how finely the future rate is read
    name: str = "clairvoyant (knows the trace)"

    def need(self, start: float, end: float) -> int:
        """The largest fleet any rate in [start, end] needs."""
        steps = int((end - start) / self.resolution_s) + 1
        peak = max(self.trace.rate(start + i * self.resolution_s) for i in range(steps + 1))
        return max(self.min_replicas, self.sizing.replicas_for(peak))

    def decide(self, obs: Observation) -> int:
        return self.need(obs.now, obs.now + self.cold_start_s + self.tick_s)
