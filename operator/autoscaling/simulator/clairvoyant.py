"""The clairvoyant limit: a policy that knows the whole trace and orders each replica exactly one cold
start before it is needed.

No autoscaler can do better for a given cold start without serving requests it cannot see coming,
so its SLO share and GPU-hours are the yardstick for ours (docs/benchmarks/autoscaling.md, the cold-start sweep).

- The fleet a rate needs comes from the simulator's own replica model (`FleetSizing`: the smallest
  fixed fleet that serves a steady rate with 99% of TTFTs within target, measured on the replica model
  exactly as the fixed fleet of the benchmark is sized; `kubeinfer.operator.autoscaling.sizing.fleet_sizing`, which
  the operator's predictive policy runs on the model it calibrates), so capacity per replica is the same for
  every policy compared.
- At every tick it asks for the largest need over [now, now + cold start + tick]: a replica ordered now
  is ready at now + cold start, just in time for the rate it must serve then.
- It keeps a ready replica only while the need within one cold start says so, and releases it the
  moment the need falls otherwise: releasing and re-ordering later costs one cold start of billing,
  keeping it costs the gap, and the window picks the cheaper. Its GPU-hours are thus close to the
  least that serves the trace at that share.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeinfer.operator.autoscaling.sizing.fleet_sizing import FleetSizing

from .observation import Observation
from .sim import Trace

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
