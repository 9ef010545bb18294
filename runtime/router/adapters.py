"""LoRA adapters at the router (docs/lora.md): which one a request names, where it is loaded, and loading it where
none is.

- A request's `model` names the base model, an adapter, or nothing served here: 404 `model_not_found`, as a replica
  answers. The adapters are those the service offers (`--lora-modules NAME=PATH`) and any a replica up reports.
- A request for an adapter goes only to replicas that report it loaded (`kubeinfer_lora_adapter_loaded{adapter}`,
  or loaded by this router since their last scrape); among them the usual policy picks.
- Where no replica up has it, the least-loaded replica is asked to load it (`POST /v1/load_lora_adapter`), once for
  all the requests that want it meanwhile (single flight). The router holds no API key: the load carries the
  `Authorization` of the request that started it. A refusal (400: a broken adapter, LoRA off, ...) reaches each
  of those clients as the replica wrote it, and is not remembered (the next request asks again: the files may
  have been fixed); a refusal of the key (401/403) is not passed to a request holding another key, which asks
  with its own. A replica that does not answer is left to the proxy (down, as for a refused connection).
"""
import asyncio
import json
import logging
import time

from kubeinfer.runtime.router import relayed
from kubeinfer.runtime.router.affinity import stable_hash
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.replicas import Replica, ReplicaSet
from kubeinfer.runtime.router.settings import RouterSettings
from kubeinfer.runtime.router.upstream import ConnectFailed, UpstreamError
from kubeinfer.runtime.router.waiting_room import Refused

logger = logging.getLogger(__name__)
LOAD_PATH = "/v1/load_lora_adapter"
KEY_REFUSED = (401, 403)


class LoadFailed(Exception):
    """A replica refused to load an adapter: its answer goes to the client unchanged."""

    def __init__(self, replica_url: str, status: int, body: bytes, content_type: bytes | None,
                 authorization: bytes | None):
        super().__init__(f"replica {replica_url} answered {status} to loading the adapter")
        self.replica_url, self.status, self.body = replica_url, status, body
        self.content_type = content_type or b"application/json"
        self.authorization = authorization   # the key the load was asked with


class LoadUnreachable(Exception):
    """The replica asked to load an adapter did not answer (connect failure, broken connection, timeout)."""

    def __init__(self, replica: Replica, why: str):
        super().__init__(why)
        self.replica = replica


class Adapters:
    def __init__(self, settings: RouterSettings, replicas: ReplicaSet, metrics: RouterMetrics):
        self.offered = settings.lora_modules   # name -> path on the replicas' nodes
        self.base_name = settings.served_model_name
        self.stale_after, self.load_timeout = settings.stale_after, settings.queue_timeout
        self.replicas, self.metrics = replicas, metrics
        self._flights: dict[str, asyncio.Future] = {}   # adapter -> its load in progress
        self.num_waiting = 0                           # requests waiting for a load

    def names(self) -> list[str]:
        """Every adapter known: those offered, then those only some replica up reports."""
        reported = {name for replica in self.replicas.available() for name in replica.adapters}
        return [*self.offered, *sorted(reported - self.offered.keys())]

    def resolve(self, model: object) -> str | None:
        """The adapter `model` names; None for the base model, or while the base model's name is not known yet
        (no `--served-model-name`, no replica scraped: the replica will judge). Raises `Refused` (404)."""
        base = self.base_name or self.replicas.model_name
        if not isinstance(model, str) or model == base:
            return None
        if model in self.offered or any(model in replica.adapters for replica in self.replicas.available()):
            return model
        if base is None:
            return None
        adapters = ", ".join(map(repr, self.names()))
        raise Refused(404, f"model {model!r} is not served here; this service serves {base!r}"
                           + (f" and the adapters {adapters}" if adapters else ""), "model_not_found", None,
                      param="model")

    def holders(self, adapter: str) -> list[Replica]:
        """The replicas up that have `adapter` loaded."""
        return [replica for replica in self.replicas.available() if adapter in replica.adapters]

    def least_loaded(self, adapter: str) -> Replica | None:
        """Where to load `adapter`: the least load (in flight here + waiting there), then the least KV in use, then
        the fewest adapters already loaded; the same replica for every router on a tie (rendezvous hash)."""
        now = time.monotonic()
        return min(self.replicas.available(), default=None,
                   key=lambda r: (r.is_stale(now, self.stale_after), r.in_flight + r.waiting, r.kv_usage,
                                  len(r.adapters), stable_hash(adapter, r.url)))

    async def place(self, adapter: str, headers: list[tuple[bytes, bytes]], deadline: float) -> None:
        """Returns once `adapter` was loaded on a replica (unless that replica went down since: look again), or at
        once if no replica is up. `headers`: the request's. Raises `LoadFailed` (the replica's refusal),
        `LoadUnreachable`, or `Refused` (404: an adapter nobody offers and no replica has any more; 503: not
        loaded by `deadline`)."""
        authorization = relayed.authorization(headers)
        while True:
            flight = self._flights.get(adapter)
            if flight is None:
                if adapter not in self.offered:
                    raise Refused(404, f"adapter {adapter!r} is loaded on no replica up, and this router does not "
                                       "know its path (--lora-modules)", "model_not_found", None, param="model")
                target = self.least_loaded(adapter)
                if target is None:
                    return   # no replica up any more: the caller waits for one
                flight = asyncio.ensure_future(self._load(target, adapter, authorization))
                self._flights[adapter] = flight
            self.num_waiting += 1
            try:
                # shielded: a request whose client left stops waiting, the load goes on for the others
                await asyncio.wait_for(asyncio.shield(flight), max(0.0, deadline - time.monotonic()))
                return
            except LoadFailed as failed:
                if failed.status in KEY_REFUSED and failed.authorization != authorization:
                    continue   # another key was refused: this request asks with its own
                raise
            except asyncio.TimeoutError:
                raise Refused(503, f"adapter {adapter!r} was not loaded on a replica in time; retry later",
                              "no_replica", self.load_timeout) from None
            finally:
                self.num_waiting -= 1

    async def _load(self, replica: Replica, adapter: str, authorization: bytes | None) -> None:
        """One `POST /v1/load_lora_adapter` to `replica`; notes the adapter loaded there on a 200."""
        started = time.monotonic()
        try:
            status, body, content_type = await asyncio.wait_for(self._ask(replica, adapter, authorization),
                                                                self.load_timeout)
        except (ConnectFailed, UpstreamError, asyncio.TimeoutError) as error:
            self.metrics.lora_loads.labels("unreachable").inc()
            why = f"loading adapter {adapter!r} failed: {type(error).__name__} {error}".strip()
            raise LoadUnreachable(replica, why) from None
        finally:
            self._flights.pop(adapter, None)   # the next request that finds no replica with it asks again
        if status != 200:
            self.metrics.lora_loads.labels("failed").inc()
            logger.warning("replica %s refused to load adapter %r (%d): %s", replica.url, adapter, status,
                           body[:300].decode(errors="replace"))
            raise LoadFailed(replica.url, status, body, content_type, authorization)
        replica.note_loaded(adapter)
        self.metrics.lora_loads.labels("loaded").inc()
        self.metrics.lora_load_seconds.observe(time.monotonic() - started)
        logger.info("replica %s loaded adapter %r in %.3f s", replica.url, adapter, time.monotonic() - started)

    async def _ask(self, replica: Replica, adapter: str, authorization: bytes | None) -> tuple:
        body = json.dumps({"lora_name": adapter, "lora_path": self.offered[adapter]}).encode()
        headers = [(b"content-type", b"application/json")]
        if authorization is not None:
            headers.append((b"authorization", authorization))
        response, answer = await replica.upstream.fetch("POST", LOAD_PATH, headers, body)
        return response.status, answer, response.header(b"content-type")
