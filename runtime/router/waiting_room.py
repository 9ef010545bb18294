"""Where requests wait while no replica is up (scale from zero, a rollout, every replica down).

Bounded by a count and by bytes of request bodies; each request waits at most until its deadline. Beyond the
bounds a request is refused at once with 429; past its deadline with 503; both say when to retry.
"""
import asyncio
import time

from kubeinfer.runtime.router.replicas import ReplicaSet


class Refused(Exception):
    """A request the router answers itself with an OpenAI-style error (`retry_after` None: no Retry-After)."""

    def __init__(self, status: int, message: str, code: str, retry_after: float | None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after
        self.param = param


class WaitingRoom:
    def __init__(self, replicas: ReplicaSet, max_requests: int, max_bytes: int, timeout_s: float):
        self.replicas = replicas
        self.max_requests, self.max_bytes, self.timeout_s = max_requests, max_bytes, timeout_s
        self.num_waiting = 0
        self.num_bytes = 0

    async def wait_until_up(self, num_bytes: int, deadline: float) -> float:
        """Returns once some replica is up (at once if one is): the seconds waited. Raises `Refused`."""
        if self.replicas.any_up.is_set():
            return 0.0
        if self.num_waiting + 1 > self.max_requests or self.num_bytes + num_bytes > self.max_bytes:
            raise Refused(429, f"no replica is ready and {self.num_waiting} requests are already waiting for one; "
                               "retry later", "queue_full", self.timeout_s)
        started = time.monotonic()
        self.num_waiting += 1
        self.num_bytes += num_bytes
        try:
            await asyncio.wait_for(self.replicas.any_up.wait(), max(0.0, deadline - started))
        except asyncio.TimeoutError:
            raise Refused(503, f"no replica became ready within {self.timeout_s:g} s; retry later",
                          "no_replica", self.timeout_s) from None
        finally:
            self.num_waiting -= 1
            self.num_bytes -= num_bytes
        return time.monotonic() - started
