"""The three ways to choose a replica: `prefix` (affinity within bounded load), `least-load`, `round-robin`."""
import itertools
import time

from kubeinfer.runtime.router.affinity import Candidate, PrefixIndex, chunk_hashes, pick, stable_hash
from kubeinfer.runtime.router.replicas import Replica
from kubeinfer.runtime.router.settings import RouterSettings


class Chooser:
    def __init__(self, settings: RouterSettings):
        self.settings = settings
        self.index = PrefixIndex()
        self._turn = itertools.count()

    def choose(self, available: list[Replica], text: str, adapter: str | None = None,
               scope: tuple = ()) -> tuple[Replica, str]:
        """(replica, reason) among `available` (not empty). The prefix policy records the pick in its index
        at once, so the next request with this prefix follows it even before this one finishes. A prompt under a
        LoRA `adapter`, or of another sharing `scope` (`affinity.cache_scope`), is another prefix (`chunk_hashes`)."""
        policy = self.settings.policy
        if policy == "round-robin":
            return available[next(self._turn) % len(available)], "round_robin"
        now = time.monotonic()
        candidates = [Candidate(r.url, r.in_flight, r.waiting, r.kv_usage, r.is_stale(now, self.settings.stale_after))
                      for r in available]
        by_url = {r.url: r for r in available}
        if policy == "least-load":
            best = min(candidates, key=lambda c: (c.stale, c.in_flight + c.waiting, c.kv_usage))
            return by_url[best.name], "least_load"
        hashes = chunk_hashes(text, self.settings.chunk_chars, self.settings.max_chunks, adapter, scope)
        first_chunk = text[:self.settings.chunk_chars]
        tie_key = stable_hash(first_chunk) if adapter is None else stable_hash(adapter, first_chunk)
        name, reason = pick(candidates, self.index.matches(hashes), len(hashes), self.settings.weights,
                            tie_key, self.index.footprint)
        self.index.record(hashes, name)
        return by_url[name], reason

    def forget(self, replica: Replica) -> None:
        """What the prefix index says `replica` holds is no longer true (see `PrefixIndex.forget`)."""
        self.index.forget(replica.url)
