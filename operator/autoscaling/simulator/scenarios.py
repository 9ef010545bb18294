"""Arrival traces, fleet sizing for a rate, and the figures reported per (trace, policy)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .policies import FixedFleet
from .sim import ReplicaModel, Simulation, Trace

DURATION_S = 2400.0
WARMUP_S = 300.0  # every trace runs at its starting rate before this; figures start here


Lengths = tuple[tuple[int, int], ...] | None   # (prompt, output) pairs to draw from; None: the log-normal ones


def steady(rate: float = 6.0, duration_s: float = DURATION_S, lengths: Lengths = None) -> Trace:
    return Trace("steady", duration_s, lambda t: rate, rate, lengths=lengths)


def diurnal(low: float = 1.0, high: float = 12.0, duration_s: float = DURATION_S) -> Trace:
    """One compressed day: low at the start and end, high in the middle."""
    return Trace("diurnal", duration_s,
                 lambda t: low + (high - low) * (1 - math.cos(2 * math.pi * t / duration_s)) / 2, high)


def burst(base: float = 1.5, factor: float = 10.0, start_s: float = 600.0, length_s: float = 600.0,
          duration_s: float = DURATION_S) -> Trace:
    """Base rate, then `factor` x base for `length_s`, then base again (a step up and down)."""
    return Trace("burst 10x", duration_s, lambda t: base * factor if start_s <= t < start_s + length_s else base,
                 base * factor, burst_start_s=start_s)


def flash_crowd(base: float = 1.0, peak: float = 14.0, start_s: float = 600.0, rise_s: float = 10.0,
                decay_s: float = 300.0, duration_s: float = DURATION_S) -> Trace:
    """Base rate; at `start_s` a crowd arrives within `rise_s`, then decays exponentially."""
    def rate(t: float) -> float:
        if t < start_s:
            return base
        if t < start_s + rise_s:
            return base + (peak - base) * (t - start_s) / rise_s
        return base + (peak - base) * math.exp(-(t - start_s - rise_s) / decay_s)
    return Trace("flash crowd", duration_s, rate, peak, burst_start_s=start_s)


ALL_TRACES = (steady, diurnal, burst, flash_crowd)


def calibration_run(rate: float, lengths: Lengths) -> Trace:
    """The steady load a fleet is sized on: 5 minutes; with a trace's own lengths, long enough for 600
    requests, since a few long prompts among 75 would swing the share by points."""
    return steady(rate, 300.0 if lengths is None else max(300.0, 600.0 / rate), lengths)


@functools.lru_cache(maxsize=None)
def replicas_for_rate(rate: float, ttft_target_s: float, model: ReplicaModel = ReplicaModel(),
                      share: float = 0.99, seed: int = 7, lengths: Lengths = None) -> int:
    """Smallest fixed fleet that serves a steady `rate` with `share` of requests within the TTFT target
    (measured on the simulator itself: a 5-minute steady run per candidate size, requests of `lengths`)."""
    for n in range(1, 64):
        sim = Simulation(calibration_run(rate, lengths), FixedFleet(n), initial_replicas=n, model=model,
                         seed=seed).run()
        if summarize(sim, ttft_target_s, warmup_s=0.0).slo_share >= share:
            return n
    raise ValueError(f"no fleet under 64 replicas serves {rate} req/s")


@functools.lru_cache(maxsize=None)
def concurrency_per_replica(ttft_target_s: float, model: ReplicaModel = ReplicaModel(), share: float = 0.99,
                            seed: int = 7, lengths: Lengths = None) -> float:
    """Mean in-flight requests on one replica at the highest steady rate it serves with `share` of
    TTFTs within target: the fair per-replica target for concurrency-based policies."""
    best = None
    for i in range(1, 200):
        rate = 0.25 * i
        sim = Simulation(calibration_run(rate, lengths), FixedFleet(1), initial_replicas=1, model=model,
                         seed=seed).run()
        if summarize(sim, ttft_target_s, warmup_s=0.0).slo_share < share:
            break
        c = sim.samples.concurrency
        best = sum(c) / len(c)
    assert best is not None, "one replica cannot serve even 0.25 req/s within the target"
    return best


@functools.lru_cache(maxsize=None)
def saturation_throughput(model: ReplicaModel = ReplicaModel(), seed: int = 7, lengths: Lengths = None) -> float:
    """Requests per second one replica serves when overloaded (first tokens per second over the last
    4 minutes of a 5-minute run at twice that rate): what `benchmarks/serve.py` at a high request rate
    reports, and what spec.autoscaling.throughputPerReplica is meant to hold."""
    rate = 2.0
    while True:  # find an overloading rate first: the queue must keep growing
        sim = Simulation(calibration_run(rate, lengths), FixedFleet(1), initial_replicas=1, model=model,
                         seed=seed).run()
        served = sum(1 for t in sim.ttft_times if 60.0 <= t < 300.0) / 240.0
        if served < 0.8 * rate:
            return served
        rate *= 2


@dataclass(frozen=True)
class Result:
    trace: str
    policy: str
    num_requests: int
    slo_share: float  # share of requests with TTFT <= target (unserved requests count as misses)
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    gpu_hours: float  # replica-hours (one GPU per replica) over the trace's duration
    peak_replicas: int
    scale_events: int
    first_scale_up_s: float | None  # from the burst's start to the first scale-up decision after it

    def row(self) -> str:
        first = "—" if self.first_scale_up_s is None else f"{self.first_scale_up_s:.0f}"
        return (f"| {self.trace} | {self.policy} | {100 * self.slo_share:.1f}% | {self.ttft_p95_s:.2f} | "
                f"{self.ttft_p99_s:.2f} | {self.gpu_hours:.2f} | {self.peak_replicas} | {self.scale_events} | {first} |")


HEADER = ("| trace | policy | TTFT ≤ target | TTFT P95 (s) | TTFT P99 (s) | GPU-hours | peak replicas | "
          "scale events | burst → first scale-up (s) |\n|---|---|---|---|---|---|---|---|---|")


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, int(math.ceil(q * len(sorted_values))) - 1)]


def summarize(sim: Simulation, ttft_target_s: float, warmup_s: float = WARMUP_S) -> Result:
    """Figures over [warmup_s, duration]: requests that arrived in it, replica time billed in it."""
    ttfts = sorted(r.first_token - r.arrival if not math.isnan(r.first_token) else math.inf
                   for r in sim.requests if r.arrival >= warmup_s)
    within = sum(1 for v in ttfts if v <= ttft_target_s)
    duration = sim.trace.duration_s

    def clip(t: float) -> float:
        return min(max(t, warmup_s), duration)

    billed = sum(clip(r.terminated if r.terminated is not None else duration) - clip(r.created) for r in sim.replicas)
    events = [e for e in sim.scale_events if e[0] >= warmup_s]
    first_up = None
    if sim.trace.burst_start_s is not None:
        ups = [t for t, a, b in events if b > a and t >= sim.trace.burst_start_s]
        first_up = ups[0] - sim.trace.burst_start_s if ups else None
    s = sim.samples
    peak = max((n for t, n in zip(s.t, s.replicas) if warmup_s <= t <= duration), default=0)
    return Result(sim.trace.name, sim.policy.name, len(ttfts), within / max(1, len(ttfts)),
                  _quantile(ttfts, 0.50), _quantile(ttfts, 0.95), _quantile(ttfts, 0.99), billed / 3600.0,
                  peak, len(events), first_up)
