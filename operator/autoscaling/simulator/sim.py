"""Discrete-event simulator of one InferenceService under load, driven by an autoscaling policy.

Model (all times in seconds):
- Requests arrive by a non-homogeneous Poisson process (a trace's rate function, fixed seed), with
  log-normal prompt and output lengths.
- A router sends each request to the ready replica with the fewest outstanding requests, as long as
  that replica holds fewer than batch cap + a small local queue; otherwise (or with no ready replica)
  it holds the request (an activator/gateway queue, counted as waiting, as the queue that
  wakes a service at zero must be).
- A replica runs engine steps: each step admits waiting requests up to a batch cap and a prefill token
  budget, and lasts decode_base + decode_per_seq * running + prefill_per_token * admitted prompt
  tokens. Admitted requests get their first token at the end of that step (TTFT), running ones one
  token each; a request finishes after its output length.
- A new replica is billed from creation and becomes ready after a cold start. A removed replica stops
  taking requests, finishes its running batch (its queued requests go back to the router), and is
  billed until then. Pending replicas are removed first.
- Every second the simulator samples waiting/running/concurrency; a policy sees them through
  `Observation` (observation.py) at its own tick (our policy through Prometheus-like signals lagging by a scrape interval).
- The policy decides until the trace ends, and `tail_s` seconds after (0 by default, which the tables use:
  they count only what happens within the trace); a tail shows what a policy does once the load is gone,
  e.g. a scale-down a real run saw after its last request.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kubeinfer.operator.autoscaling.sizing.replica_model import ReplicaModel, admit

from .observation import Observation
from .replica_metrics import UsageCounters


# The built-in CPU demo model (kubeinfer serve --model demo) on one CPU thread, as fitted by
# benchmarks/autoscale/calibrate.py on 2026-11-23 (4 runs on a shared 2-vCPU machine, load 4-6: decode
# 3.0-3.3 ms + 0.14-0.17 ms/seq, prefill 0.17-0.23 ms/token at 512 tokens). For comparisons with a real
# cluster running the demo model; ReplicaModel() above stays the GPU-like model of the benchmark tables.
CPU_DEMO_MODEL = ReplicaModel(decode_base_s=0.0030, decode_per_seq_s=0.00015, prefill_s_per_token=0.0002)


@dataclass(frozen=True)
class Trace:
    name: str
    duration_s: float
    rate: Callable[[float], float]  # requests per second at time t
    peak_rate: float
    burst_start_s: float | None = None
    prompt_mean: float = 512
    output_mean: float = 128
    # A replayed trace's own requests: (arrival s, prompt tokens, output tokens), sorted; None = Poisson arrivals.
    requests: tuple[tuple[float, int, int], ...] | None = None
    # (prompt, output) pairs to draw request lengths from, instead of the log-normal ones (a trace's own).
    lengths: tuple[tuple[int, int], ...] | None = None


@dataclass(slots=True)
class Request:
    arrival: float
    prompt: int
    output: int
    first_token: float = math.nan
    generated: int = 0


class Replica:
    __slots__ = ("rid", "created", "ready_at", "terminated", "draining", "waiting", "running", "prefill", "busy")

    def __init__(self, rid: int, now: float, cold_start: float):
        self.rid, self.created, self.ready_at = rid, now, now + cold_start
        self.terminated: float | None = None
        self.draining = False
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefill: list[Request] = []
        self.busy = False

    def ready(self, now: float) -> bool:
        return now >= self.ready_at and not self.draining and self.terminated is None

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.prefill)


class Policy(Protocol):
    name: str
    tick_s: float

    def decide(self, obs: Observation) -> int: ...


@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    concurrency: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)  # not draining (ready + pending)
    billed: list[int] = field(default_factory=list)  # everything alive, draining included
    usage: list[tuple] = field(default_factory=list)  # the replicas' calibration series (UsageCounters.snapshot)


_ARRIVE, _STEP, _READY, _TICK, _SAMPLE = range(5)


def generate_requests(trace: Trace, seed: int) -> list[Request]:
    """A replayed trace's own requests; else thinning of a Poisson process at the peak rate, with lengths drawn
    from `trace.lengths` or log-normal (sigma 0.8), clipped."""
    if trace.requests is not None:
        return [Request(t, p, o) for t, p, o in trace.requests if t < trace.duration_s]
    rng = random.Random(seed)
    out, t = [], 0.0
    sigma = 0.8
    while True:
        t += rng.expovariate(trace.peak_rate)
        if t >= trace.duration_s:
            return out
        if rng.random() * trace.peak_rate <= trace.rate(t):
            if trace.lengths is not None:
                p, o = trace.lengths[rng.randrange(len(trace.lengths))]
            else:
                p = int(min(4096, max(16, rng.lognormvariate(math.log(trace.prompt_mean) - sigma**2 / 2, sigma))))
                o = int(min(1024, max(4, rng.lognormvariate(math.log(trace.output_mean) - sigma**2 / 2, sigma))))
            out.append(Request(t, p, o))


class Simulation:
    def __init__(self, trace: Trace, policy: Policy, initial_replicas: int, model: ReplicaModel = ReplicaModel(),
                 seed: int = 0, drain_cap_s: float = 900.0, tail_s: float = 0.0):
        self.trace, self.policy, self.model = trace, policy, model
        self.decide_until_s = trace.duration_s + tail_s
        self.requests = generate_requests(trace, seed)
        self.arrival_times = [r.arrival for r in self.requests]   # sorted: what a request counter would say
        self.replicas: list[Replica] = []
        self.router: deque[Request] = deque()
        self.samples = Samples()
        self.counters = UsageCounters()
        self.ttft_times: list[float] = []
        self.ttft_values: list[float] = []
        self.scale_events: list[tuple[float, int, int]] = []
        self.end_s = trace.duration_s + max(drain_cap_s, tail_s)
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.num_initial = initial_replicas
        for _ in range(initial_replicas):
            r = self._new_replica(0.0)
            r.ready_at = 0.0

    # ---- event plumbing ---------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def _new_replica(self, now: float) -> Replica:
        r = Replica(len(self.replicas), now, self.model.cold_start_s)
        self.replicas.append(r)
        self._push(r.ready_at, _READY, r)
        return r

    def run(self) -> Simulation:
        for req in self.requests:
            self._push(req.arrival, _ARRIVE, req)
        self._push(0.0, _SAMPLE)
        self._push(self.policy.tick_s, _TICK)
        n_events = 0
        while self._events:
            now, _, kind, payload = heapq.heappop(self._events)
            if now > self.end_s:
                break
            n_events += 1
            assert n_events < 50_000_000, "runaway simulation"
            if kind == _ARRIVE:
                self._route(payload, now)
            elif kind == _STEP:
                self._end_step(payload, now)
            elif kind == _READY:
                self._drain_router(now)
            elif kind == _SAMPLE:
                self._sample(now)
                if now < self.decide_until_s or self._in_flight():
                    self._push(now + 1.0, _SAMPLE)
            elif kind == _TICK and now <= self.decide_until_s:
                self._tick(now)
                self._push(now + self.policy.tick_s, _TICK)
        return self

    # ---- routing and engine -----------------------------------------------------------------
    def _route(self, req: Request, now: float) -> None:
        limit = self.model.max_batch + self.model.local_queue
        open_ = [r for r in self.replicas if r.ready(now) and r.outstanding < limit]
        if not open_ or self.router:
            self.router.append(req)
            self._drain_router(now)
            return
        self._assign(min(open_, key=lambda r: r.outstanding), req, now)

    def _assign(self, r: Replica, req: Request, now: float) -> None:
        r.waiting.append(req)
        if not r.busy:
            self._start_step(r, now)

    def _drain_router(self, now: float) -> None:
        limit = self.model.max_batch + self.model.local_queue
        while self.router:
            open_ = [r for r in self.replicas if r.ready(now) and r.outstanding < limit]
            if not open_:
                return
            self._assign(min(open_, key=lambda r: r.outstanding), self.router.popleft(), now)

    def _start_step(self, r: Replica, now: float) -> None:
        m = self.model
        r.prefill, tokens = admit(r.waiting, len(r.running), m)
        if not r.running and not r.prefill:
            r.busy = False
            if r.draining and r.terminated is None:
                r.terminated = now
            return
        r.busy = True
        dt = m.step_seconds(len(r.running), tokens)
        self.counters.step(len(r.running), tokens, dt)
        self._push(now + dt, _STEP, r)

    def _end_step(self, r: Replica, now: float) -> None:
        still = []
        counters = self.counters
        for req in r.running:
            req.generated += 1
            if req.generated < req.output:
                still.append(req)
            else:
                counters.finished(req.generated)
        for req in r.prefill:
            req.first_token = now
            req.generated = 1
            self.ttft_times.append(now)
            self.ttft_values.append(now - req.arrival)
            counters.first_token(req.prompt)
            if req.output > 1:
                still.append(req)
            else:
                counters.finished(1)
        r.running, r.prefill = still, []
        if self.router and r.ready(now):
            self._drain_router(now)
        self._start_step(r, now)

    def _in_flight(self) -> bool:
        return bool(self.router) or any(r.outstanding for r in self.replicas if r.terminated is None)

    # ---- sampling and control -----------------------------------------------------------------
    def _sample(self, now: float) -> None:
        alive = [r for r in self.replicas if r.terminated is None]
        waiting = len(self.router) + sum(len(r.waiting) for r in alive)
        running = sum(len(r.running) + len(r.prefill) for r in alive)
        s = self.samples
        s.t.append(now)
        s.waiting.append(waiting)
        s.running.append(running)
        s.concurrency.append(waiting + running)
        s.ready.append(sum(1 for r in alive if r.ready(now)))
        s.replicas.append(sum(1 for r in alive if not r.draining))
        s.billed.append(len(alive))
        s.usage.append(self.counters.snapshot())

    def _tick(self, now: float) -> None:
        active = [r for r in self.replicas if r.terminated is None and not r.draining]
        ready = sum(1 for r in active if r.ready(now))
        obs = Observation(now, len(active), ready, len(active) - ready, self)
        desired = max(0, int(self.policy.decide(obs)))
        if desired == len(active):
            return
        self.scale_events.append((now, len(active), desired))
        for _ in range(desired - len(active)):
            self._new_replica(now)
        if desired < len(active):
            # pending ones first (newest first), then the least loaded ready ones
            victims = sorted(active, key=lambda r: (r.ready(now), r.outstanding, -r.created))[: len(active) - desired]
            for r in victims:
                r.draining = True
                if not r.ready_at <= now:
                    r.terminated = now
                    continue
                r.waiting, moved = deque(), list(r.waiting)  # queued, not started: back to the router
                for req in moved:
                    self._route(req, now)
                if not r.busy:
                    r.terminated = now
