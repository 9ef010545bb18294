"""Many models on few GPUs, simulated (issue #51's yardstick): one multi-model trace served three ways.

- `always_on`: one GPU per model, its engine always awake.
- `scale_to_zero`: one engine per model that goes away `idle_s` after its last request ended and comes back on the
  next one after a cold start (`cold_start_s`: pod, image, weights, KV, graphs); billed from its start to its end.
- `pool`: `pods` GPUs, each hosting every model with at most `awake_per_pod` (K) awake (`kubeinfer pool`). A request
  for a model awake somewhere queues there; else the router takes a pod with a free slot, or the one whose least
  recently used awake model was used longest ago, waits for that model's requests to end, and swaps (`swap_s`: its
  sleep and this model's wake; one swap at a time per pod). Requests for the same model that come meanwhile wait
  for the same swap; those for the model being put to sleep wait and wake it again after. The K engines of a pod
  share its GPU: a step lasts its replica-model time times the pod's engines stepping at that moment (time
  slicing, a first-order model of contention). Billed `pods` x duration.

Each engine runs the autoscaler's replica model (operator.autoscaling.replica_model: steps that admit requests up to
a batch cap and a prefill budget, first token at the end of the step that admits a request). Times in seconds.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from kubeinfer.operator.autoscaling.sizing.replica_model import ReplicaModel, admit


@dataclass(slots=True)
class Request:
    arrival: float
    model: int
    prompt: int
    output: int
    first_token: float = math.nan
    generated: int = 0


@dataclass
class Engine:
    """One model's engine: it serves while `ready_at <= now`; `busy` while a step is scheduled."""
    model: int
    ready_at: float = math.inf      # inf: not serving (asleep, or scaled to zero)
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy: bool = False
    last_used: float = -math.inf
    last_idle: float = 0.0          # when it last had nothing to do

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)


def zipf_weights(models: int, exponent: float) -> list[float]:
    weights = [1 / (rank + 1) ** exponent for rank in range(models)]
    return [w / sum(weights) for w in weights]


def multi_model_trace(base: list[tuple[float, int, int]], models: int, exponent: float, requests_per_hour: float,
                      seed: int = 0, hours: float | None = None) -> list[Request]:
    """Each model's arrivals are the real trace `base` (arrival, prompt, output), repeated end to end for `hours`,
    thinned to the model's share of `requests_per_hour` (Zipf popularity) and started at a random point of it
    (wrapped around), so every model keeps the trace's bursts and gaps without the models bursting together."""
    rng = random.Random(seed)
    length = base[-1][0] + 1e-9
    if hours is not None:
        base = [(t + i * length, p, o) for i in range(math.ceil(hours * 3600 / length)) for t, p, o in base
                if t + i * length < hours * 3600]
    span = base[-1][0] + 1e-9
    base_rate = len(base) / span * 3600
    out = []
    for model, weight in enumerate(zipf_weights(models, exponent)):
        keep = min(1.0, requests_per_hour * weight / base_rate)
        shift = rng.uniform(0, span)
        for arrival, prompt, output in base:
            if rng.random() < keep:
                out.append(Request((arrival + shift) % span, model, prompt, output))
    return sorted(out, key=lambda r: r.arrival)


class MultiModelSim:
    def __init__(self, requests: list[Request], models: int, layout: str, replica: ReplicaModel = ReplicaModel(),
                 pods: int = 0, swap_s: float = 1.0, cold_start_s: float = 60.0, idle_s: float = 300.0,
                 awake_per_pod: int = 1):
        self.requests, self.layout, self.replica = requests, layout, replica
        self.pods, self.swap_s, self.cold_start_s, self.idle_s = pods, swap_s, cold_start_s, idle_s
        self.engines = [Engine(m) for m in range(models)]
        self.events: list = []
        self.seq = 0
        self.swaps = self.cold_starts = self.most_awake = 0
        self.billed_s = 0.0
        self.up_since: dict[int, float] = {}        # scale_to_zero: engine -> when its replica was created
        self.up_times: list[tuple[float, float]] = []   # scale_to_zero: each replica's (created, removed)
        self.pod_of: dict[int, int] = {}            # pool: awake, waking or queued model -> its pod
        self.pod_models: list[list[int]] = [[] for _ in range(pods)]   # pool: each pod's awake (or waking) models
        self.awake_per_pod = awake_per_pod
        self.pod_swapping: list[bool] = [False] * pods
        self.pending: dict[int, deque] = {}         # pool: pod -> models waiting for it to swap them in
        self.held: dict[int, list] = {}             # pool: model being put to sleep -> requests for it meanwhile
        if layout == "always_on":
            for engine in self.engines:
                engine.ready_at = 0.0

    def push(self, t: float, kind: str, arg) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, arg))

    def run(self) -> MultiModelSim:
        for request in self.requests:
            self.push(request.arrival, "arrive", request)
        end = self.requests[-1].arrival if self.requests else 0.0
        while self.events:
            t, _, kind, arg = heapq.heappop(self.events)
            getattr(self, "_" + kind)(t, arg)
            if kind != "idle":   # a scale-down after the last answer does not lengthen the window
                end = max(end, t)
        self.duration = end   # the last request's last token: every layout is billed over the same window
        if self.layout == "always_on":
            self.billed_s = len(self.engines) * end
        elif self.layout == "pool":
            self.billed_s = self.pods * end
        else:
            self.up_times += [(start, end) for start in self.up_since.values()]
            self.billed_s = sum(min(stop, end) - start for start, stop in self.up_times)
        return self

    # --- requests and steps (every layout)
    def _arrive(self, t: float, request: Request) -> None:
        engine = self.engines[request.model]
        engine.last_used = t
        pod = self.pod_of.get(engine.model)
        if self.layout == "pool" and self._leaving(engine.model):
            self.held.setdefault(engine.model, []).append(request)   # it is leaving: woken again after
            return
        engine.waiting.append(request)
        if self.layout == "scale_to_zero" and engine.ready_at == math.inf and engine.model not in self.up_since:
            self.up_since[engine.model] = t
            self.cold_starts += 1
            engine.ready_at = t + self.cold_start_s
            self.push(engine.ready_at, "ready", engine)
        elif self.layout == "pool" and pod is None:
            self._place(t, engine)
        self._kick(t, engine)

    def _ready(self, t: float, engine: Engine) -> None:
        self._kick(t, engine)

    def _kick(self, t: float, engine: Engine) -> None:
        if engine.busy or t < engine.ready_at or not engine.outstanding:
            return
        admitted, tokens = admit(engine.waiting, len(engine.running), self.replica)
        engine.busy = True
        seconds = self.replica.step_seconds(len(engine.running), tokens)
        if self.layout == "pool":   # the GPU is shared: time-sliced between the pod's engines stepping now
            seconds *= sum(self.engines[m].busy for m in self.pod_models[self.pod_of[engine.model]])
        self.push(t + seconds, "step", (engine, admitted))

    def _step(self, t: float, done: tuple[Engine, list[Request]]) -> None:
        engine, admitted = done
        engine.busy = False
        for request in engine.running:
            request.generated += 1
        for request in admitted:
            request.first_token, request.generated = t, 1
        engine.running = [r for r in engine.running + admitted if r.generated < r.output]
        if engine.outstanding:
            return self._kick(t, engine)
        engine.last_idle = t
        if self.layout == "scale_to_zero":
            self.push(t + self.idle_s, "idle", (engine, t))
        elif self.layout == "pool":
            self._swap_next(t, self.pod_of[engine.model])

    def _idle(self, t: float, arg: tuple[Engine, float]) -> None:
        engine, since = arg
        if engine.outstanding or engine.busy or engine.last_idle != since or engine.last_used > since:
            return   # used since
        self.up_times.append((self.up_since.pop(engine.model), t))
        engine.ready_at = math.inf

    # --- the pool
    def _place(self, t: float, engine: Engine) -> None:
        """Picks the pod to wake `engine` on: one with a free awake slot, else the one whose least recently used
        awake model was used longest ago; fewest swaps already queued first."""
        def cost(pod: int) -> tuple:
            awake = self.pod_models[pod]
            full = len(awake) + len(self.pending.get(pod, ())) >= self.awake_per_pod
            oldest = min((self.engines[m].last_used for m in awake), default=-math.inf)
            return (full, len(self.pending.get(pod, ())), oldest)
        pod = min(range(self.pods), key=cost)
        self.pod_of[engine.model] = pod
        self.pending.setdefault(pod, deque()).append(engine.model)
        self._swap_next(t, pod)

    def _victim(self, pod: int) -> int | None:
        """The awake model to put to sleep before the pod's next wake (None: a slot is free)."""
        awake = self.pod_models[pod]
        if len(awake) < self.awake_per_pod:
            return None
        return min(awake, key=lambda m: self.engines[m].last_used)

    def _leaving(self, model: int) -> bool:
        pod = self.pod_of.get(model)
        return (pod is not None and model in self.pod_models[pod] and not self.pod_swapping[pod]
                and bool(self.pending.get(pod)) and self._victim(pod) == model)

    def _swap_next(self, t: float, pod: int) -> None:
        """Starts the pod's next swap once the model it puts to sleep has nothing outstanding."""
        queue = self.pending.get(pod)
        if self.pod_swapping[pod] or not queue:
            return
        current = self._victim(pod)
        if current is not None:
            victim = self.engines[current]
            if victim.outstanding or victim.busy:
                return   # its requests end first (its last step calls this again)
            victim.ready_at = math.inf
            self.pod_models[pod].remove(current)
            del self.pod_of[current]
        model = queue.popleft()
        self.pod_models[pod].append(model)
        self.most_awake = max(self.most_awake, len(self.pod_models[pod]))
        self.pod_swapping[pod] = True
        self.swaps += 1
        self.push(t + self.swap_s, "swapped", (pod, model))
        if current is not None and (held := self.held.pop(current, None)):
            self.engines[current].waiting.extend(held)   # requests that came while it was leaving
            self._place(t, self.engines[current])

    def _swapped(self, t: float, arg: tuple[int, int]) -> None:
        pod, model = arg
        self.pod_swapping[pod] = False
        engine = self.engines[model]
        engine.ready_at = t
        self._kick(t, engine)
        self._swap_next(t, pod)

    # --- figures
    def ttft(self, q: float, after_s: float = 0.0) -> float:
        """The `q` quantile of time to first token of the requests that arrived after `after_s` (a warm-up)."""
        values = sorted(r.first_token - r.arrival for r in self.requests if r.arrival >= after_s)
        return values[min(len(values) - 1, int(q * len(values)))]
