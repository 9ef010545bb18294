"""A replica as the autoscaler prices it, and a fixed fleet of such replicas under a steady load. Pure.

A replica runs engine steps: each admits waiting requests up to a batch cap and a prefill token budget, and lasts
`decode_base_s + decode_per_seq_s * decoding sequences + prefill_s_per_token * admitted prompt tokens`. The
admitted requests get their first token at the end of that step, running ones one token each. A router sends each
request to the ready replica with the fewest outstanding requests while it holds fewer than batch cap + a small
local queue, and holds it otherwise.

The operator calibrates the costs from the service's own metrics (`calibration`) and sizes fleets by running
`steady_share` (`fleet_sizing`); the simulator of benchmarks/autoscale uses the same model and the same steps, and
sizes the clairvoyant limit with the same `fleet_sizing`, so the two use one implementation.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

Lengths = tuple[tuple[int, int], ...] | None   # (prompt, output) pairs to draw from; None: log-normal lengths


@dataclass(frozen=True)
class ReplicaModel:
    max_batch: int = 32
    prefill_token_budget: int = 4096
    prefill_s_per_token: float = 0.00012
    decode_base_s: float = 0.020
    decode_per_seq_s: float = 0.0008
    cold_start_s: float = 60.0
    local_queue: int = 8  # requests the router may queue on a replica beyond its batch cap

    def step_seconds(self, decoding: int, prefill_tokens: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * decoding + self.prefill_s_per_token * prefill_tokens

    def alone_seconds(self, prompt: int) -> float:
        """An idle replica's time to first token: one step that prefills the prompt."""
        return self.decode_base_s + self.prefill_s_per_token * prompt


def admit(waiting: deque, in_batch: int, model: ReplicaModel) -> tuple[list, int]:
    """The requests a step takes from the head of `waiting` (popped) and their prompt tokens: up to the batch cap,
    and within the prefill budget (the first one whatever its length)."""
    taken, tokens = [], 0
    while waiting and in_batch + len(taken) < model.max_batch:
        prompt = waiting[0].prompt
        if taken and tokens + prompt > model.prefill_token_budget:
            break
        tokens += prompt
        taken.append(waiting.popleft())
    return taken, tokens


def steady_requests(rate: float, duration_s: float, lengths: Lengths, seed: int) -> list[tuple[float, int, int]]:
    """Poisson arrivals at `rate` for `duration_s`: (arrival, prompt, output), lengths drawn from `lengths` or
    log-normal (means 512 / 128, sigma 0.8, clipped). The same draws as the simulator's steady trace."""
    rng = random.Random(seed)
    out, t, sigma = [], 0.0, 0.8
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        rng.random()   # the simulator's thinning draw (always accepted at a steady rate)
        if lengths is not None:
            p, o = lengths[rng.randrange(len(lengths))]
        else:
            p = int(min(4096, max(16, rng.lognormvariate(math.log(512) - sigma ** 2 / 2, sigma))))
            o = int(min(1024, max(4, rng.lognormvariate(math.log(128) - sigma ** 2 / 2, sigma))))
        out.append((t, p, o))


class _Req:
    __slots__ = ("arrival", "prompt", "output")

    def __init__(self, arrival: float, prompt: int, output: int):
        self.arrival, self.prompt, self.output = arrival, prompt, output


class _Replica:
    """Running requests are counted, not listed: one admitted at step s decodes in steps s + 1 .. s + output - 1
    (one token each), so it is kept only as a count due to leave after step s + output - 1."""
    __slots__ = ("waiting", "running", "leaving", "steps", "prefill", "busy", "decoding", "step_s")

    def __init__(self):
        self.waiting: deque[_Req] = deque()
        self.running = 0
        self.leaving: dict[int, int] = {}   # step index -> running requests that finish with it
        self.steps = 0
        self.prefill: list[_Req] = []
        self.busy = False
        self.decoding = 0     # sequences decoding in the step under way, each waiting its time for a token
        self.step_s = 0.0

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + self.running + len(self.prefill)


def steady_share(replicas: int, requests: Sequence[tuple[float, int, int]], ttft_target_s: float,
                 model: ReplicaModel, end_s: float) -> float:
    """Share of `requests` whose first token comes within the target on a fixed, ready fleet of `replicas`
    (requests not served by `end_s` count as misses)."""
    return steady_shares(replicas, requests, ttft_target_s, model, end_s)[0]


def steady_shares(replicas: int, requests: Sequence[tuple[float, int, int]], ttft_target_s: float,
                  model: ReplicaModel, end_s: float, itl_target_s: float | None = None) -> tuple[float, float]:
    """`steady_share`, and the share of the tokens after the first that come within `itl_target_s` of the one
    before (each decoding sequence waits its step's time for its next token, a step that admits a prompt included;
    1.0 without a target or without such tokens)."""
    if not requests:
        return 0.0, 1.0
    fleet = [_Replica() for _ in range(replicas)]
    limit = model.max_batch + model.local_queue
    held: deque[_Req] = deque()
    events: list[tuple[float, int, int]] = []   # (time, sequence, replica index or -1 - request index)
    reqs = [_Req(*r) for r in requests]
    for i, r in enumerate(reqs):
        events.append((r.arrival, i, -1 - i))
    heapq.heapify(events)
    seq = len(reqs)
    within = 0
    intervals = slow = 0

    def start(idx: int, now: float) -> None:
        nonlocal seq
        r = fleet[idx]
        r.prefill, tokens = admit(r.waiting, r.running, model)
        if not r.running and not r.prefill:
            r.busy = False
            return
        r.busy = True
        seq += 1
        r.decoding, r.step_s = r.running, model.step_seconds(r.running, tokens)
        heapq.heappush(events, (now + r.step_s, seq, idx))

    def assign(req: _Req, now: float) -> bool:
        best = min((i for i in range(replicas) if fleet[i].outstanding < limit), default=None,
                   key=lambda i: fleet[i].outstanding)
        if best is None:
            return False
        fleet[best].waiting.append(req)
        if not fleet[best].busy:
            start(best, now)
        return True

    while events:
        now, _, who = heapq.heappop(events)
        if now > end_s:
            break
        if who < 0:
            req = reqs[-1 - who]
            if held or not assign(req, now):
                held.append(req)
                while held and assign(held[0], now):
                    held.popleft()
            continue
        r = fleet[who]
        intervals += r.decoding
        if itl_target_s is not None and r.step_s > itl_target_s:
            slow += r.decoding
        step = r.steps
        r.steps += 1
        r.running -= r.leaving.pop(step, 0)
        for req in r.prefill:
            within += now - req.arrival <= ttft_target_s
            if req.output > 1:
                r.running += 1
                last = step + req.output - 1
                r.leaving[last] = r.leaving.get(last, 0) + 1
        r.prefill = []
        while held and assign(held[0], now):
            held.popleft()
        start(who, now)
    return within / len(reqs), 1.0 - slow / intervals if intervals else 1.0
