"""The router in front of a model pool (pool.py): one route per model (its engines on the pool's pods, its waiting
room, its prefix index), chosen by the request's `model`; one `Pool` that wakes and puts models to sleep."""
import asyncio
import dataclasses
import json

from kubeinfer.runtime.router.adapters import Adapters
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.policies import Chooser
from kubeinfer.runtime.router.pool import Pool, engine_urls, pod_of
from kubeinfer.runtime.router.proxy import Proxy
from kubeinfer.runtime.router.replicas import Replica, ReplicaSet
from kubeinfer.runtime.router.route_trace import UNTRACED, RouteTrace
from kubeinfer.runtime.router.settings import RouterSettings
from kubeinfer.runtime.router.waiting_room import Refused, WaitingRoom
from kubeinfer.runtime.server.auth import ANONYMOUS, Tenant


class PoolRoutes:
    def __init__(self, settings: RouterSettings, metrics: RouterMetrics):
        self.metrics = metrics
        self.models: dict[str, ReplicaSet] = {}
        self.rooms: dict[str, WaitingRoom] = {}
        for model, port in settings.pool_models.items():
            self.models[model] = ReplicaSet(sorted(engine_urls(set(settings.upstreams), port)),
                                            settings.scrape_interval, settings.stale_after, settings.connect_timeout)
            self.rooms[model] = WaitingRoom(self.models[model], settings.max_queued_requests,
                                            settings.max_queued_bytes, settings.queue_timeout)
        self.pool = Pool(self.models, settings.pool_models, settings.pool_max_awake, settings.pool_sleep_level,
                         metrics, settings.queue_timeout)
        self.proxies = {model: Proxy(replicas, Chooser(settings), self.rooms[model], metrics, settings.queue_timeout,
                                     Adapters(self._one_model(settings, model), replicas, metrics), pool=self.pool)
                        for model, replicas in self.models.items()}

    @staticmethod
    def _one_model(settings: RouterSettings, model: str) -> RouterSettings:
        """The settings of one model's route: its name served, no pool (its replicas are given, not discovered)."""
        return dataclasses.replace(settings, upstreams=["http://unused"], service=None, endpoints_file=None,
                                   pool_models={}, served_model_name=model)

    # What the router reads of its replica set (app.py), over every model's engines
    model_name = None

    @property
    def known(self) -> bool:
        return all(replicas.known for replicas in self.models.values())

    @property
    def replicas(self) -> dict[str, Replica]:
        return {url: engine for replicas in self.models.values() for url, engine in replicas.replicas.items()}

    def available(self) -> list[Replica]:
        return [engine for replicas in self.models.values() for engine in replicas.available()]

    def set_urls(self, urls: set[str]) -> None:
        """Discovery's URLs: one per pod of the pool."""
        self.pool.set_pods(urls)

    async def scrape_forever(self) -> None:
        await asyncio.gather(*(replicas.scrape_forever() for replicas in self.models.values()))

    async def forward(self, scope: dict, body: bytes, send, received_at: float, tenant: Tenant = ANONYMOUS,
                      trace: RouteTrace = UNTRACED) -> None:
        """The model's route forwards it (`Proxy.forward`); a model the pool does not serve: 404."""
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):   # the replica answers bad JSON with its own 400: any model's
            model = next(iter(self.proxies))
        if model not in self.proxies:
            raise Refused(404, f"model {model!r} is not served here; this pool serves "
                               f"{', '.join(map(repr, self.proxies))}", "model_not_found", None, param="model")
        await self.proxies[model].forward(scope, body, send, received_at, tenant, trace)

    def update_metrics(self) -> None:
        """The gauges read at each scrape of the router: what is awake where, and requests waiting for a wake."""
        m = self.metrics
        m.queue_requests.set(sum(room.num_waiting for room in self.rooms.values()))
        m.queue_bytes.set(sum(room.num_bytes for room in self.rooms.values()))
        m.pool_waiting.set(self.pool.num_waiting)
        m.pool_awake.clear()
        for model, replicas in self.models.items():
            for engine in replicas.replicas.values():
                m.pool_awake.labels(model, pod_of(engine.url)).set(
                    1.0 if engine.up and engine.sleep_level == 0 else 0.0)

    def close(self) -> None:
        for replicas in self.models.values():
            replicas.close()
        for room in self.rooms.values():
            if room.releasing is not None:
                room.releasing.cancel()
