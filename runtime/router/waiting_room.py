"""Where requests wait while no replica is up (scale from zero, a rollout, every replica down).

Bounded by a count and by bytes of request bodies; each request waits at most until its deadline. Beyond the
bounds a request is refused at once with 429; past its deadline with 503; both say when to retry.

Policy: once a replica is up, the waiting requests leave in a tenant-fair order, not in their arrival order
(tenants, weights and priorities from the replicas' keys file, router/tenants.py; requests without a key are one
tenant, anonymous): strict priority classes (lower first), then within a class the tenant that has had the fewest
requests let go per unit of its weight, first come first served within a tenant. A tenant that comes back after
it had nothing waiting starts at the lowest count of those waiting (no credit banked while it sent nothing). Requests,
not tokens: the router does not know what a request will cost. Each leaves on its own turn of the event loop, in
that order, so they reach the replicas in it (a replica that admits in arrival order then serves a small tenant's
requests among the first, not behind a flood that came before them). While requests wait, a new one waits behind
them by the same rules, even if a replica is up.
"""
import asyncio
import time
from collections import deque

from kubeinfer.runtime.router.replicas import ReplicaSet
from kubeinfer.runtime.server.auth import ANONYMOUS, Tenant


class Refused(Exception):
    """A request the router answers itself with an OpenAI-style error (`retry_after` None: no Retry-After)."""

    def __init__(self, status: int, message: str, code: str, retry_after: float | None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after
        self.param = param


class FairTurns:
    """The waiting requests' turns (futures, set when the request may go), in the order they are let go."""

    def __init__(self):
        self._classes: dict[int, dict[str, deque[asyncio.Future]]] = {}   # priority -> tenant -> turns
        self._weights: dict[str, float] = {}
        self.counters: dict[str, float] = {}   # tenant -> requests let go / weight
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def add(self, tenant: Tenant, turn: asyncio.Future) -> None:
        tenants = self._classes.setdefault(tenant.priority, {})
        if tenant.name not in tenants:   # back after a pause: no credit banked while it sent nothing
            waiting = [self.counters.get(t, 0.0) for queues in self._classes.values() for t in queues]
            self.counters[tenant.name] = max(self.counters.get(tenant.name, 0.0), min(waiting, default=0.0))
            tenants[tenant.name] = deque()
        tenants[tenant.name].append((time.monotonic(), turn))
        self._weights[tenant.name] = tenant.weight
        self._length += 1

    def pop(self) -> asyncio.Future:
        """The next request's turn: the lowest class, the tenant with the lowest count, its oldest request."""
        priority = min(self._classes)
        queues = self._classes[priority]
        name = min(queues, key=lambda t: (self.counters[t], queues[t][0][0]))
        self.counters[name] += 1 / self._weights[name]
        return self._take(priority, name, queues[name][0])[1]

    def remove(self, tenant: Tenant, turn: asyncio.Future) -> None:
        """Takes out a request that stopped waiting (its deadline, or its client left); no-op if it was let go."""
        queue = self._classes.get(tenant.priority, {}).get(tenant.name, ())
        entry = next((entry for entry in queue if entry[1] is turn), None)
        if entry is not None:
            self._take(tenant.priority, tenant.name, entry)

    def _take(self, priority: int, name: str, entry: tuple) -> tuple:
        queues = self._classes[priority]
        queues[name].remove(entry)
        if not queues[name]:
            del queues[name]
            if not queues:
                del self._classes[priority]
        self._length -= 1
        return entry


class WaitingRoom:
    def __init__(self, replicas: ReplicaSet, max_requests: int, max_bytes: int, timeout_s: float):
        self.replicas = replicas
        self.max_requests, self.max_bytes, self.timeout_s = max_requests, max_bytes, timeout_s
        self.num_waiting = 0
        self.num_bytes = 0
        self.turns = FairTurns()
        self.releasing: asyncio.Task | None = None   # lets the waiting requests go (stopped with the router)

    async def wait_until_up(self, num_bytes: int, deadline: float, tenant: Tenant = ANONYMOUS) -> float:
        """Returns once some replica is up and it is this request's turn (at once if a replica is up and nothing
        waits): the seconds waited. Raises `Refused`."""
        if self.replicas.any_up.is_set() and not self.turns:
            return 0.0
        if self.num_waiting + 1 > self.max_requests or self.num_bytes + num_bytes > self.max_bytes:
            raise Refused(429, f"no replica is ready and {self.num_waiting} requests are already waiting for one; "
                               "retry later", "queue_full", self.timeout_s)
        started = time.monotonic()
        turn = asyncio.get_running_loop().create_future()
        self.turns.add(tenant, turn)
        self.num_waiting += 1
        self.num_bytes += num_bytes
        if self.releasing is None or self.releasing.done():
            self.releasing = asyncio.ensure_future(self._release())
        try:
            await asyncio.wait_for(turn, max(0.0, deadline - started))
        except asyncio.TimeoutError:
            raise Refused(503, f"no replica became ready within {self.timeout_s:g} s; retry later",
                          "no_replica", self.timeout_s) from None
        finally:
            self.turns.remove(tenant, turn)
            self.num_waiting -= 1
            self.num_bytes -= num_bytes
        return time.monotonic() - started

    async def _release(self) -> None:
        """Lets the waiting requests go in their fair order, one per turn of the event loop, while a replica is up."""
        while self.turns:
            await self.replicas.any_up.wait()
            if not self.turns:   # all of them left while no replica was up
                return
            turn = self.turns.pop()
            if not turn.done():   # (a turn whose waiter just timed out is skipped)
                turn.set_result(None)
            await asyncio.sleep(0)
