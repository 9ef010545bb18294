"""A model pool at the router (docs/router.md, "Model pool"): pods that each host several models, one `kubeinfer
serve` per model on its own port, at most `max_awake` of them awake at a time per pod.

- The router knows each engine's sleep level from its scrapes (`kubeinfer_engine_sleep_level`) and from its own
  sleeps and wakes since (a scrape begun before those does not undo them).
- A request for a model goes to an engine of that model that is awake, if any pod has one (the usual policy picks
  among them). Else to the pod where waking it costs least: one with a free awake slot, else the one whose least
  recently used awake model was used longest ago.
- Waking a model on a pod that has `max_awake` awake first puts the least recently used of them to sleep (`POST
  /sleep`, answered once asleep): unload before load, so the pod never holds more awake models than it can fit.
  That engine takes no new request from the moment it is chosen, and the sleep is asked only once the requests
  this router sent it have finished. Then `POST /wake_up`. One swap at a time per pod; the requests that need a
  swap wait for it (bounded by the queue timeout: 503 after it); those for a model already awake do not wait.
- The sleep and wake carry the `Authorization` of the request that asked for them (the router holds no key); a
  refusal goes to that client as the engine wrote it (`LoadFailed`).
"""
import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kubeinfer.runtime.router import relayed
from kubeinfer.runtime.router.adapters import LoadFailed, LoadUnreachable
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.replicas import Replica, ReplicaSet
from kubeinfer.runtime.router.upstream import ConnectFailed, UpstreamError
from kubeinfer.runtime.router.waiting_room import Refused

logger = logging.getLogger(__name__)
DRAIN_POLL_SECONDS = 0.01   # how often a pending sleep looks whether the engine's requests here have finished


def pod_of(url: str) -> str:
    """An engine's pod: its URL's host (every engine of a pool pod listens on the pod's address)."""
    return urlsplit(url).hostname or url


def engine_urls(pod_urls: set[str], port: int) -> set[str]:
    """Each pod's engine on `port`, from the pods' URLs (any port: discovery's, or none)."""
    return {f"{urlsplit(url).scheme}://{_host(url)}:{port}" for url in pod_urls}


def _host(url: str) -> str:
    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


@dataclass
class PodState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)   # one swap at a time
    used_at: dict[str, float] = field(default_factory=dict)     # engine URL -> time.monotonic() of its last request
    leaving: set[str] = field(default_factory=set)              # engines being put to sleep: no new request


class Pool:
    def __init__(self, models: dict[str, ReplicaSet], ports: dict[str, int], max_awake: int, sleep_level: int,
                 metrics: RouterMetrics, timeout: float):
        """`models`: each model's engines, one per pod, on its port of `ports`."""
        self.max_awake, self.sleep_level, self.metrics, self.timeout = max_awake, sleep_level, metrics, timeout
        self.models, self.ports = models, ports
        self.pods: dict[str, PodState] = {}
        self.num_waiting = 0   # requests waiting for a swap

    def on_pod(self, pod: str) -> list[Replica]:
        """Every engine known on `pod`, up or not (one whose scrape failed may still hold its memory)."""
        return [engine for replicas in self.models.values() for engine in replicas.replicas.values()
                if pod_of(engine.url) == pod]

    def set_pods(self, urls: set[str]) -> None:
        """The pool's pods are now those of `urls` (discovery's: one per pod, any port)."""
        for model, replicas in self.models.items():
            replicas.set_urls(engine_urls(urls, self.ports[model]))
        pods = {pod_of(url) for url in urls}
        self.pods = {pod: state for pod, state in self.pods.items() if pod in pods}

    def awake(self, engine: Replica) -> bool:
        return engine.sleep_level == 0 and engine.url not in self._pod(engine).leaving

    def candidates(self, available: list[Replica]) -> list[Replica]:
        """Among a model's engines up: those awake, else the one engine where waking it costs least."""
        awake = [engine for engine in available if self.awake(engine)]
        if awake or not available:
            return awake or available
        return [min(available, key=self._wake_cost)]

    def _awake_beside(self, engine: Replica) -> list[Replica]:
        """The other engines of its pod that are awake (leaving ones included: they still hold their memory)."""
        return [e for e in self.on_pod(pod_of(engine.url)) if e is not engine and e.sleep_level == 0]

    def _wake_cost(self, engine: Replica) -> tuple:
        others = self._awake_beside(engine)
        if len(others) < self.max_awake:
            return (0, 0.0, engine.in_flight)
        state = self.pods.get(pod_of(engine.url), PodState())
        oldest = min(state.used_at.get(e.url, 0.0) for e in others)
        return (1, oldest, sum(e.in_flight for e in others))

    async def admit(self, engine: Replica, headers: list[tuple[bytes, bytes]], deadline: float) -> float:
        """Returns once `engine` is awake with this request counted in its `in_flight` (so no sleep is asked of it
        before the request ends), after a swap on its pod if needed; the seconds waited. Raises `Refused` (503:
        not awake by `deadline`), `LoadFailed`, `LoadUnreachable`."""
        state = self._pod(engine)
        if self.awake(engine):
            return self._enter(engine, state, 0.0)
        started = time.monotonic()
        self.num_waiting += 1
        try:
            await asyncio.wait_for(state.lock.acquire(), max(0.0, deadline - started))
        except asyncio.TimeoutError:
            raise Refused(503, f"model {engine.model_name!r} could not be woken in time; retry later", "no_replica",
                          self.timeout) from None
        finally:
            self.num_waiting -= 1
        try:
            if not self.awake(engine):
                await self._swap_in(engine, state, relayed.authorization(headers), deadline)
        finally:
            state.lock.release()
        self.metrics.pool_waited.labels(engine.model_name or "").inc()
        return self._enter(engine, state, time.monotonic() - started)

    def _enter(self, engine: Replica, state: PodState, waited: float) -> float:
        engine.in_flight += 1
        state.used_at[engine.url] = time.monotonic()
        return waited

    async def _swap_in(self, engine: Replica, state: PodState, authorization: bytes | None, deadline: float) -> None:
        started = time.monotonic()
        while True:
            awake = self._awake_beside(engine)
            if len(awake) < self.max_awake:
                break
            victim = min(awake, key=lambda e: state.used_at.get(e.url, 0.0))
            state.leaving.add(victim.url)
            try:
                while victim.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(DRAIN_POLL_SECONDS)
                if victim.in_flight:
                    raise Refused(503, f"no room to wake model {engine.model_name!r}: model {victim.model_name!r} "
                                       "still serves on its pod; retry later", "no_replica", self.timeout)
                await self._ask(victim, f"/sleep?level={self.sleep_level}", authorization, deadline)
                victim.note_sleep_level(self.sleep_level)
                self.metrics.pool_sleeps.labels(victim.model_name or "").inc()
                logger.info("put %s (%s) to sleep to wake %s", victim.url, victim.model_name, engine.model_name)
            finally:
                state.leaving.discard(victim.url)
        await self._ask(engine, "/wake_up", authorization, deadline)
        engine.note_sleep_level(0)
        seconds = time.monotonic() - started
        self.metrics.pool_wakeups.labels(engine.model_name or "").inc()
        self.metrics.pool_wake_seconds.labels(engine.model_name or "").observe(seconds)
        logger.info("woke %s (%s) in %.3f s", engine.url, engine.model_name, seconds)

    async def _ask(self, engine: Replica, path: str, authorization: bytes | None, deadline: float) -> None:
        headers = [] if authorization is None else [(b"authorization", authorization)]
        try:
            response, body = await asyncio.wait_for(engine.upstream.fetch("POST", path, headers, b""),
                                                    max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise Refused(503, f"{path.split('?')[0]} of model {engine.model_name!r} did not finish in time; retry "
                               "later", "no_replica", self.timeout) from None
        except (ConnectFailed, UpstreamError) as error:
            raise LoadUnreachable(engine, f"{path} failed: {type(error).__name__} {error}".strip()) from None
        if response.status != 200:
            logger.warning("engine %s refused %s (%d): %s", engine.url, path, response.status,
                           body[:300].decode(errors="replace"))
            raise LoadFailed(engine.url, response.status, body, response.header(b"content-type"),
                             authorization)

    def _pod(self, engine: Replica) -> PodState:
        return self.pods.setdefault(pod_of(engine.url), PodState())
