"""The clairvoyant frontier: the fewest GPU-hours that reach each SLO share on a trace, by schedules that know every
request to come (issue #55).

One clairvoyant schedule gives one (SLO share, GPU-hours) point, and which point is "the limit" depends on how it
sizes. The rate-table limit (clairvoyant.py) sizes by the rate alone, from a table measured under steady Poisson
arrivals with the trace's average request: on prefill-heavy traffic whose requests come in clusters it lands below
a fixed fleet on SLO share, so it bounds nothing there. The frontier instead takes many schedules and keeps their
Pareto envelope; a policy is then judged by the frontier's GPU-hours at the policy's own SLO share, and a policy
that holds a share with fewer GPU-hours than the frontier needs for it "lands beyond the frontier": the yardstick
failed, and a test says so (tests/operator/test_autoscale_frontier.py).

The schedules:
- `CostClairvoyant(utilization, window_s)`: the fleet the requests to come cost. Each request costs the replica
  time the replica model charges for it (its prompt's prefill, and its output's decode steps at a full batch's
  share of a step); the fleet at time u is the cost of the arrivals in [u, u + window) over window x utilization.
  It orders a replica one cold start before it is needed and keeps it while the need within a cold start says so,
  as the rate-table limit does. A short window sees clusters of prompts that a 30 s rate averages away; the
  utilization is the headroom (a prompt's TTFT needs a replica free of other prefills when it arrives).
- the runs of the other schedules that read the trace (the sweep passes the rate-table limit's and the causal
  limits'), and fixed fleets from one replica up: a clairvoyant may run any of them.
- hindsight schedules (`hindsight_point(n, hold_s)`): a fixed fleet of n, and one more replica within `hold_s` of
  every request that fleet missed. On steady traffic a fixed fleet of n misses a share by a few requests, n + 1
  costs a whole replica more, and the cost of the requests to come does not say where the misses fall (a cost
  schedule held between n and n + 1 holds no more than n + 1 at n + 1's GPU-hours: each short order costs its cold
  start, and a queue of a few requests is chance, not cost); a policy whose fleet wanders between them (the
  KubeAI-style moving average, which reacts to the queues themselves) lands between the two points, and only a
  schedule that knows where n fell short reaches there.
Where a policy lands beyond the points, `refine` runs more before the verdict: hindsight schedules around the
largest fixed fleet that misses the policy's share, then utilizations bisected towards the policy's share (the
grid is coarse, and a share is not monotone in the utilization), then the same with replicas ordered half a cold
start ahead and not ahead at all (a late order loses some share at a step and saves the replicas' wait, the kind of
point a causal policy makes).
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .observation import Observation
from .policies import FixedFleet
from .scenarios import Result, summarize
from .sim import ReplicaModel, Simulation, Trace, generate_requests

WINDOWS_S = (1.0, 5.0, 30.0)
HOLDS_S = (5.0, 15.0, 30.0, 60.0, 120.0)   # how long the hindsight schedules hold a replica around a miss
UTILIZATIONS = (0.05, 0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9)
MAX_FLEET = 200          # a sanity bound on any schedule's fleet
SLO_TOLERANCE = 0.001    # a policy's share may exceed the frontier's by this much (0.1 point) ...
GPU_TOLERANCE = 0.01     # ... and its GPU-hours undercut it by this share, before it counts as beyond


def request_cost(prompt: int, output: int, model: ReplicaModel) -> float:
    """Replica seconds one request takes: its prefill, and each later token's share of a full batch's step."""
    decode = model.decode_per_seq_s + model.decode_base_s / model.max_batch
    return model.prefill_s_per_token * prompt + max(0, output - 1) * decode


@dataclass
class CostClairvoyant:
    """Sizes the fleet from the cost of the requests to come (the module's docstring)."""

    utilization: float
    window_s: float
    cold_start_s: float
    model: ReplicaModel
    lead_s: float | None = None   # how far ahead a replica is ordered (None: one cold start, just in time)
    min_replicas: int = 1
    tick_s: float = 1.0
    resolution_s: float = 0.5
    name: str = ""
    needs: list[int] | None = field(default=None, repr=False)   # `plan`'s, made at the first tick if not given

    def __post_init__(self):
        if not self.name:
            late = "" if self.lead_s is None else f", ordered {self.lead_s:g} s ahead"
            self.name = f"clairvoyant by cost ({self.window_s:g} s window, utilization {self.utilization:.3g}{late})"

    def steps(self, duration_s: float) -> int:
        """How many grid points a plan holds: from 0 to past the trace's end by a cold start and a tick."""
        return int((duration_s + self.cold_start_s + self.tick_s) / self.resolution_s) + 2

    def plan(self, arrivals: list[float], costs: list[float], duration_s: float) -> list[int]:
        """The need at every `resolution_s` from 0 to past the trace's end (arrivals sorted)."""
        prefix = [0.0]
        for cost in costs:
            prefix.append(prefix[-1] + cost)
        needs = []
        for k in range(self.steps(duration_s)):
            start = k * self.resolution_s
            work = prefix[bisect_left(arrivals, start + self.window_s)] - prefix[bisect_left(arrivals, start)]
            needs.append(min(MAX_FLEET, max(self.min_replicas, math.ceil(work / (self.window_s * self.utilization)))))
        return needs

    def need(self, start: float, end: float) -> int:
        """The largest need at the grid's points in [start, end]: the arrivals in [start, end + window)."""
        first = int(start / self.resolution_s)
        last = min(len(self.needs) - 1, int(end / self.resolution_s))
        return max(self.needs[first:last + 1], default=self.min_replicas)

    def decide(self, obs: Observation) -> int:
        if self.needs is None:
            requests = obs.sim.requests
            self.needs = self.plan(obs.sim.arrival_times, [request_cost(r.prompt, r.output, self.model)
                                                           for r in requests], obs.sim.trace.duration_s)
        lead = self.cold_start_s if self.lead_s is None else self.lead_s
        return self.need(obs.now, obs.now + lead + self.tick_s)


def around(times: list[float], hold_s: float, n: int, resolution_s: float, steps: int) -> list[int]:
    """A plan of n replicas, n + 1 at the grid points within `hold_s` of any of `times` (sorted)."""
    needs = []
    for k in range(steps):
        t = k * resolution_s
        i = bisect_left(times, t - hold_s)
        needs.append(n + 1 if i < len(times) and times[i] <= t + hold_s else n)
    return needs


@dataclass(frozen=True)
class Point:
    slo_share: float
    gpu_hours: float
    schedule: str


def envelope(points: Iterable[Point]) -> list[Point]:
    """The Pareto envelope, highest share first: each point needs fewer GPU-hours than every point with a higher
    share (ties: the higher share)."""
    kept: list[Point] = []
    for point in sorted(points, key=lambda p: (-p.slo_share, p.gpu_hours)):
        if not kept or point.gpu_hours < kept[-1].gpu_hours:
            kept.append(point)
    return kept


def fewest_gpu_hours(frontier: list[Point], slo_share: float) -> float:
    """The frontier's GPU-hours at a share: the fewest among its points that reach it (a staircase, each step a
    run); infinite above its highest share."""
    return min((p.gpu_hours for p in frontier if p.slo_share >= slo_share), default=math.inf)


def share_within(frontier: list[Point], gpu_hours: float) -> float:
    """The highest share the frontier holds on a budget of `gpu_hours` (past the 1% tolerance): what a clairvoyant
    holds with what another schedule spends."""
    return max((p.slo_share for p in frontier if p.gpu_hours <= gpu_hours * (1 + GPU_TOLERANCE)), default=0.0)


def beyond(result: Result, frontier: list[Point]) -> bool:
    """Whether a policy's run holds its share with fewer GPU-hours than the frontier needs for it, beyond the
    tolerances."""
    return result.gpu_hours * (1 + GPU_TOLERANCE) < fewest_gpu_hours(frontier, result.slo_share - SLO_TOLERANCE)


def against(result: Result, frontier: list[Point]) -> float:
    """A policy's GPU-hours over the frontier's at the policy's own share (>= 1 unless it lands beyond)."""
    return result.gpu_hours / fewest_gpu_hours(frontier, result.slo_share - SLO_TOLERANCE)


@dataclass
class Frontier:
    """The frontier of one trace on one replica model, grown on demand (`refine`)."""

    trace: Trace
    model: ReplicaModel
    ttft_target_s: float
    seed: int = 0
    warmup_s: float | None = None   # None: summarize's default
    points: list[Point] | None = None
    fixed: dict[int, Point] = field(default_factory=dict)   # the fixed fleets run, by size
    misses: dict[int, list[float]] = field(default_factory=dict, repr=False)   # `missed_by`'s, by fleet size

    def run(self, policy, initial: int) -> Point:
        sim = Simulation(self.trace, policy, initial_replicas=initial, model=self.model, seed=self.seed).run()
        kwargs = {} if self.warmup_s is None else {"warmup_s": self.warmup_s}
        result = summarize(sim, self.ttft_target_s, **kwargs)
        return Point(result.slo_share, result.gpu_hours, policy.name)

    @functools.cached_property
    def requests(self) -> tuple[list[float], list[float]]:
        """The arrivals every run replays, and what each request costs."""
        requests = generate_requests(self.trace, self.seed)
        return [r.arrival for r in requests], [request_cost(r.prompt, r.output, self.model) for r in requests]

    def cost_point(self, utilization: float, window_s: float, lead_s: float | None = None) -> Point:
        policy = CostClairvoyant(utilization, window_s, self.model.cold_start_s, self.model, lead_s)
        policy.needs = policy.plan(*self.requests, self.trace.duration_s)
        return self.run(policy, policy.need(0.0, self.model.cold_start_s + policy.tick_s))   # ready at the start

    def build(self, extra: Iterable[Point] = (), progress: Callable[[str], None] = lambda line: None) -> list[Point]:
        """Every cost schedule of the grid, the `extra` points of runs made elsewhere, and fixed fleets from one
        replica until one reaches the best share of the others or costs more than any of them."""
        points = []
        for window in WINDOWS_S:
            for utilization in UTILIZATIONS:
                points.append(self.cost_point(utilization, window))
                progress(f"{points[-1].schedule}: {100 * points[-1].slo_share:.1f}% / {points[-1].gpu_hours:.2f}")
        points += extra
        best_share, most = max(p.slo_share for p in points), max(p.gpu_hours for p in points)
        for n in range(1, MAX_FLEET + 1):
            point = self.fixed[n] = self.run(FixedFleet(n, name=f"fixed, {n} replicas"), n)
            points.append(point)
            progress(f"{point.schedule}: {100 * point.slo_share:.1f}% / {point.gpu_hours:.2f}")
            if point.slo_share >= best_share or point.gpu_hours > most:
                break
        self.points = points
        return envelope(points)

    def hindsight_point(self, n: int, hold_s: float) -> Point:
        """A fixed fleet of n, and one more replica within `hold_s` of every request the fixed fleet of n missed
        (ordered a cold start ahead): the extra replica where n fell short, not where the requests' cost says."""
        policy = CostClairvoyant(1.0, 1.0, self.model.cold_start_s, self.model, min_replicas=n,
                                 name=f"clairvoyant: {n} replicas, {n + 1} within {hold_s:g} s of {n}'s misses")
        policy.needs = around(self.missed_by(n), hold_s, n, policy.resolution_s, policy.steps(self.trace.duration_s))
        return self.run(policy, n)

    def missed_by(self, n: int) -> list[float]:
        """The arrivals of the requests a fixed fleet of n misses (unserved included), run once per n."""
        if n not in self.misses:
            run = Simulation(self.trace, FixedFleet(n), n, self.model, self.seed).run()
            self.misses[n] = [r.arrival for r in run.requests
                              if not r.first_token - r.arrival <= self.ttft_target_s]   # NaN: unserved
        return self.misses[n]

    def short_of(self, share: float) -> int | None:
        """The largest fixed fleet run that misses `share`, if one does."""
        return max((n for n, point in self.fixed.items() if point.slo_share < share), default=None)

    def refine(self, result: Result, rounds: int = 5) -> list[Point]:
        """While `result` lands beyond the frontier: first the largest fixed fleet that misses the result's share with
        one more replica around its misses, held longer and longer; then more cost schedules, bisecting the
        utilization (geometrically, between the grid's ends) towards the result's share, in every window, ordered
        one cold start ahead, half a cold start and none (late orders lose some share at a step and save the
        replicas' wait: the causal limits' kind of point)."""
        n = self.short_of(result.slo_share - SLO_TOLERANCE)
        for hold in () if n is None else HOLDS_S:
            if not beyond(result, envelope(self.points)):
                return envelope(self.points)
            self.points.append(self.hindsight_point(n, hold))
        for lead in (None, self.model.cold_start_s / 2, 0.0):
            for window in WINDOWS_S:
                lo, hi = UTILIZATIONS[0], UTILIZATIONS[-1]   # a lower utilization holds more share
                for _ in range(rounds):
                    if not beyond(result, envelope(self.points)):
                        return envelope(self.points)
                    middle = math.sqrt(lo * hi)
                    point = self.cost_point(middle, window, lead)
                    self.points.append(point)
                    if point.slo_share >= result.slo_share:
                        lo = middle
                    else:
                        hi = middle
        return envelope(self.points)
