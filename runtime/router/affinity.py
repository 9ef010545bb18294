"""Prefix affinity: which replica most likely holds a prompt's prefix in its KV cache, and the pick itself.

A prompt's text is cut into fixed-size character chunks; chunk i's hash chains the hash of chunk i-1, so equal
hashes mean equal prefixes (as the runtime's block manager chains the hashes of full token blocks). The index
remembers, per prefix hash, the replicas that were sent that prefix lately; a replica's match is the longest
chain it owns. Everything here is pure or owns only its own state, so it is unit-tested without a network.
"""
import hashlib
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass


def stable_hash(*parts: object) -> int:
    """A 64-bit hash that is the same in every process (Python's `hash` of a str is salted per process): two
    routers in front of the same replicas break ties the same way."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def chunk_hashes(text: str, chunk_chars: int, max_chunks: int, adapter: str | None = None,
                 scope: tuple = ()) -> list[int]:
    """Chained hashes of the full `chunk_chars`-long chunks at the start of `text` (a partial tail has none).

    The chain starts from what a replica's prefix cache keys blocks by besides the tokens (block_manager's cache
    root): the LoRA `adapter` and the `scope` (`cache_scope`: the sharing scope and the request's salt). A replica
    never reuses KV across those, so the same text is another prefix under each."""
    root = (adapter, *scope)
    hashes, parent = [], (0 if not any(part is not None for part in root) else stable_hash("root", *root))
    for start in range(0, min(len(text) // chunk_chars, max_chunks) * chunk_chars, chunk_chars):
        parent = stable_hash(parent, text[start:start + chunk_chars])
        hashes.append(parent)
    return hashes


def prompt_text(body: dict) -> str:
    """The text whose prefix the replica caches: the prompt, or the chat messages in order (role and content), or a
    Responses request's instructions and input items as such messages.

    Not the model's chat template: the router only needs equal conversations to give equal text, and a longer
    conversation to extend the text of its earlier turns, which any fixed rendering does."""
    if "input" in body:   # the Responses API: its instructions, then its input as messages
        items = body["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        instructions = body.get("instructions")
        body = {"messages": ([{"role": "system", "content": instructions}] if instructions else []) +
                            [item for item in items or () if isinstance(item, dict) and "role" in item]}
    if "messages" in body:
        parts = []
        for message in body.get("messages") or ():
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):   # content parts: their text, in order
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            parts.append(f"<{message.get('role', '') if isinstance(message, dict) else ''}>{content or ''}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]   # a batch of prompts: the first one decides
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt or ()))


def cache_scope(tenant, body, sharing: str) -> tuple:
    """The part of a replica's cache root the router can know (`chunk_hashes`' scope): the tenant's sharing scope
    (`Tenant.cache_scope`) and the request's `cache_salt`."""
    salt = body.get("cache_salt") if isinstance(body, dict) else None
    return (tenant.cache_scope(sharing), salt if isinstance(salt, str) else None)


class PrefixIndex:
    """Prefix hash -> replicas sent that prefix, least recently used first out beyond `max_entries`.

    It also counts, per replica, the prefix chunks it owns (its footprint): how much distinct prefix text it
    was given to cache, so that new prefixes go where the least is kept."""

    def __init__(self, max_entries: int = 200_000, max_owners: int = 4):
        self.max_entries, self.max_owners = max_entries, max_owners
        self._owners: OrderedDict[int, list[str]] = OrderedDict()
        self.footprint: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._owners)

    def matches(self, hashes: list[int]) -> dict[str, int]:
        """Per replica, how many leading chunks of this prompt it was sent (its longest match)."""
        found: dict[str, int] = {}
        for depth in range(len(hashes), 0, -1):
            for replica in self._owners.get(hashes[depth - 1], ()):
                found.setdefault(replica, depth)
        return found

    def record(self, hashes: list[int], replica: str) -> None:
        for value in hashes:
            owners = self._owners.get(value)
            if owners is None:
                self._owners[value] = [replica]
                self.footprint[replica] += 1
                continue
            self._owners.move_to_end(value)
            if replica in owners:
                owners.remove(replica)
            else:
                self.footprint[replica] += 1
            owners.append(replica)   # most recent last; the oldest owner is forgotten first
            self.footprint.subtract(owners[:-self.max_owners])
            del owners[:-self.max_owners]
        while len(self._owners) > self.max_entries:
            self.footprint.subtract(self._owners.popitem(last=False)[1])

    def forget(self, replica: str) -> None:
        """Drops `replica` from every prefix: its cache is gone (it refused a connection: it restarted, or left)."""
        if not self.footprint.get(replica):
            return   # it owns no entry (the footprint counts them): no scan for each request a dead replica refuses
        for value in [value for value, owners in self._owners.items() if replica in owners]:
            owners = self._owners[value]
            owners.remove(replica)
            if not owners:
                del self._owners[value]
        self.footprint.pop(replica, None)


@dataclass
class Candidate:
    """A replica as the pick sees it: the router's own in-flight count, and its last scrape."""
    name: str
    in_flight: int
    waiting: float = 0.0
    kv_usage: float = 0.0
    stale: bool = False   # no recent scrape: read as busy


@dataclass(frozen=True)
class Weights:
    prefix: float = 1.0    # per share of the prompt's chunks already sent to the replica
    load: float = 0.5      # per share of the busiest candidate's load (in flight here + waiting there)
    kv: float = 0.25       # per share of the replica's KV cache in use
    epsilon: float = 1.0   # bounded load: skip replicas above (1 + epsilon) x the mean in flight (measured)
    footprint: float = 0.25  # per share of the largest footprint (prefix chunks owned) among the candidates

    def __post_init__(self):
        for name in ("prefix", "load", "kv", "epsilon", "footprint"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} weight must be >= 0, got {getattr(self, name)}")


def load_cap(in_flight: list[int], epsilon: float) -> int:
    """Most requests one replica may hold once this one is added: ceil((1 + epsilon) x mean), counting it
    (consistent hashing with bounded loads, Mirrokni et al. 2018). Some replica is always under it."""
    return math.ceil((1 + epsilon) * (sum(in_flight) + 1) / len(in_flight))


def pick(candidates: list[Candidate], matches: dict[str, int], num_chunks: int, weights: Weights,
         prefix_key: int | None = None, footprint: dict[str, int] | None = None) -> tuple[str, str]:
    """(replica name, reason): the best score among replicas under the load cap.

    score = prefix x matched share - load x load share - kv x KV use - footprint x footprint share; a stale
    replica counts as fully loaded. `footprint`: prefix chunks owned per replica (`PrefixIndex.footprint`).
    Reasons: `bounded` (a replica with a longer match was over the cap), else `prefix` (the pick holds part of
    the prefix) or `load` (it holds none: load decided). `prefix_key`: the prompt's first chunk hash."""
    assert candidates, "pick needs at least one candidate"
    cap = load_cap([c.in_flight for c in candidates], weights.epsilon)
    loads = {c.name: (math.inf if c.stale else c.in_flight + c.waiting) for c in candidates}
    busiest = max((v for v in loads.values() if v != math.inf), default=0.0) or 1.0
    footprint = footprint or {}
    largest = max((footprint.get(c.name, 0) for c in candidates), default=0) or 1

    def score(c: Candidate) -> float:
        share = matches.get(c.name, 0) / num_chunks if num_chunks else 0.0
        load_share = 1.0 if c.stale else loads[c.name] / busiest
        kv = 1.0 if c.stale else c.kv_usage
        kept = footprint.get(c.name, 0) / largest
        return weights.prefix * share - weights.load * load_share - weights.kv * kv - weights.footprint * kept

    under_cap = [c for c in candidates if c.in_flight + 1 <= cap]
    # Equal scores (no replica holds the prefix, all idle) are broken by rendezvous hashing on the first chunk,
    # so new prefixes spread over the replicas even when requests come one at a time.
    first = prefix_key if prefix_key is not None else 0
    best = max(under_cap, key=lambda c: (round(score(c), 9), -c.in_flight, stable_hash(first, c.name)))
    matched = matches.get(best.name, 0)
    if any(matches.get(c.name, 0) > matched for c in candidates if c not in under_cap):
        return best.name, "bounded"
    return best.name, "prefix" if matched else "load"
