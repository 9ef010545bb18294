"""A stand-in Prometheus whose series follow bursty traffic served by the replicas that are really Ready.

Each service has its own arrival curve (`BurstyTrace`: a base rate with bursts of 4-8x at random times) and a
fluid model of its replicas: every second, the arrivals (Poisson draws) join the queue, and the Ready pods, read
from the API server by the caller (`set_ready`), serve `RATE_PER_REPLICA` requests per second each. The answers
are those of the operator's fleet round of queries (operator/autoscaling/signals/prometheus_fleet.py): the queue, the
running requests, first tokens per second over the metric window and over the recent range, the pods reporting,
and the time of the sample (`timestamp()`, the operator's signal time): the wall time of the tick whose queue is
answered, as a scrape's timestamp is that of its values. Every query is answered as of its evaluation time (the
`time` parameter the operator sends, one for all the queries of a round): the values of the latest tick at or before
it, as Prometheus answers with the latest sample at or before it. (Each query was answered with the state when it
arrived, so a tick between a round's `queue` and `oldest` queries put a queue beside the next tick's time: a span
between two samples a second off the queue's, +-20% on an arrival rate measured over a 5 s pass; before that the
time was the answer's wall time to the second.)
A service with no Ready pod has no series, as no pod reports. TTFT and the calibration's step series are not
emulated (empty answers: the policy reads the queue and the arrival rate).
"""
from __future__ import annotations

import math
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from fake_prometheus import FakePrometheus
from kubeinfer.operator.autoscaling.signals.prometheus_fleet import fleet_queries
from kubeinfer.operator.autoscaling.signals.measured import RECENT_COUNT_SPAN_S

RATE_PER_REPLICA = 2.0      # requests per second one replica serves (4 at a time, 2 s each)
SLOTS_PER_REPLICA = 4
WINDOW = re.compile(r"\[(\d+)s\]")


@dataclass
class BurstyTrace:
    """A base rate with bursts: exponential gaps (mean `mean_gap_s`) between bursts of 45-120 s at 4-8x."""
    seed: int
    duration_s: float
    mean_gap_s: float = 240.0
    base: float = field(init=False)
    bursts: list[tuple[float, float, float]] = field(init=False)   # (start, end, multiplier)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.base = rng.uniform(0.5, 1.5)
        self.bursts, t = [], rng.uniform(30, self.mean_gap_s)
        while t < self.duration_s:
            length = rng.uniform(45, 120)
            self.bursts.append((t, t + length, rng.uniform(4, 8)))
            t += length + rng.expovariate(1 / self.mean_gap_s)

    def rate(self, t: float) -> float:
        return self.base * next((m for start, end, m in self.bursts if start <= t < end), 1.0)

    def need(self, t: float) -> int:
        """Replicas that serve the rate at `t` at full use."""
        return max(1, math.ceil(self.rate(t) / RATE_PER_REPLICA))


class ServiceModel:
    def __init__(self, trace: BurstyTrace, seed: int) -> None:
        self.trace, self.rng = trace, random.Random(seed)
        self.queue, self.running, self.ready = 0.0, 0.0, 0
        self.served: deque[tuple[float, float]] = deque()   # (time, requests started in that second)
        # (wall time, trace time, queue, running) of the latest ticks: what a query evaluated at a time answers
        self.ticks: deque[tuple[float, float, float, float]] = deque(maxlen=120)

    def tick(self, t: float, dt: float, wall: float) -> None:
        arrivals = _poisson(self.rng, self.trace.rate(t) * dt)
        backlog = self.queue + arrivals
        started = min(backlog, self.ready * RATE_PER_REPLICA * dt)
        self.queue = backlog - started
        self.running = min(self.ready * SLOTS_PER_REPLICA, started / dt * SLOTS_PER_REPLICA / RATE_PER_REPLICA)
        self.served.append((t, started))
        self.ticks.append((wall, t, self.queue, self.running))
        while self.served and self.served[0][0] < t - 600:
            self.served.popleft()

    def at(self, wall: float | None) -> tuple[float, float, float, float] | None:
        """(wall time, trace time, queue, running) of the latest tick at or before `wall` (the latest if None; the
        oldest kept if all are later); None before the first tick."""
        if not self.ticks:
            return None
        return next((tick for tick in reversed(self.ticks) if wall is None or tick[0] <= wall), self.ticks[0])

    def started_per_s(self, t: float, span_s: float) -> float:
        """Requests started per second over the `span_s` seconds up to trace time `t`."""
        return sum(n for at, n in self.served if t - span_s < at <= t) / span_s


def _poisson(rng: random.Random, mean: float) -> int:
    count, limit, product = 0, math.exp(-mean), rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


class TracePrometheus(FakePrometheus):
    """fake_prometheus's HTTP side (it counts the queries) with answers from each service's trace."""

    def __init__(self, namespace: str, traces: dict[str, BurstyTrace], port: int = 0) -> None:
        self.started = time.monotonic()
        self.models = {name: ServiceModel(trace, i) for i, (name, trace) in enumerate(traces.items())}
        self.lock, self.unknown = threading.Lock(), set()
        self._stop = threading.Event()
        super().__init__(namespace, list(traces), port)

    def start(self) -> None:
        """Starts the trace (its time 0) and the replicas' model; until then every queue is empty."""
        self.started, self.started_wall = time.monotonic(), time.time()
        threading.Thread(target=self._run, daemon=True).start()

    def now(self) -> float:
        """Seconds into the trace."""
        return time.monotonic() - self.started

    def set_ready(self, ready: dict[str, int]) -> None:
        with self.lock:
            for name, model in self.models.items():
                model.ready = ready.get(name, 0)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        next_t = 1.0
        while not self._stop.wait(max(0.0, next_t - self.now())):
            with self.lock:
                for model in self.models.values():
                    model.tick(next_t, 1.0, self.started_wall + next_t)
            next_t += 1.0

    def answer(self, query: str, at: float | None = None) -> list[dict]:
        window = WINDOW.search(query)
        signal = {q: name for name, q in fleet_queries(int(window.group(1)) if window else 60).items()}.get(query)
        if signal is None:
            self.unknown.add(query)
        rows = []
        with self.lock:
            for name, m in self.models.items():
                if m.ready == 0:
                    continue
                wall, t, queue, running = m.at(at) or (time.time(), 0.0, 0.0, 0.0)
                value = {"queue": queue, "running": running, "pods": float(m.ready), "oldest": wall,
                         "rate": m.started_per_s(t, int(window.group(1)) if window else 60),
                         "recent_rate": m.started_per_s(t, RECENT_COUNT_SPAN_S)}.get(signal)
                if value is not None:
                    rows.append({"metric": {"namespace": self.namespace, "service": name, "model_name": name},
                                 "value": [time.time(), str(value)]})
        return rows
