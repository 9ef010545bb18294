"""API keys and per-key token quotas.

Keys come from a file (one per line: `KEY [TOKENS_PER_MINUTE] [tenant=NAME] [weight=W] [priority=P]
[cache_group=NAME]`; `#`
starts a comment; e.g. a mounted Kubernetes Secret) and/or the environment (`KUBEINFER_API_KEYS="k1,k2:5000"`). With no keys
configured the API is open. A quota counts prompt and completion tokens over a sliding minute; a request
is refused (429) before admission when its prompt would exceed what the minute has left.
"""
import hashlib
import hmac
import math
import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.runtime.errors import ConfigError

WINDOW_SECONDS = 60.0
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"   # a tenant's or cache group's name


@dataclass(frozen=True)
class Tenant:
    """Whose requests these are, for the `fair` scheduling policy and the per-tenant metrics. Its name is what the
    metrics show: never the key itself."""
    name: str
    weight: float = 1.0   # its share of tokens against the other tenants' weights
    priority: int = 0     # strict classes: lower goes first
    cache_group: str | None = None   # tenants of one group trust each other: they share prefix cache blocks

    def cache_scope(self, sharing: str) -> tuple[str, str] | None:
        """Whose prefix cache blocks its requests may reuse (`SamplingParams.cache_scope`): under `tenant` sharing
        (--prefix-cache-sharing) its group's or its own, under `shared` everyone's (None)."""
        if sharing == "shared":
            return None
        return ("group", self.cache_group) if self.cache_group else ("tenant", self.name)


ANONYMOUS = Tenant("anonymous")   # requests without keys (the API is open): one tenant


@dataclass(frozen=True)
class KeyEntry:
    tokens_per_minute: int | None
    tenant: Tenant


def key_tenant_name(key: str) -> str:
    """A key's default tenant name: a short hash, stable across edits of the file, that does not reveal the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def _options(words: list[str], where: str) -> dict:
    """`tenant=NAME weight=W priority=P cache_group=NAME` words of a keys-file line."""
    options = {}
    for word in words:
        name, _, value = word.partition("=")
        try:
            if name == "tenant" and re.fullmatch(NAME_PATTERN, value):
                options["name"] = value
            elif name == "cache_group" and re.fullmatch(NAME_PATTERN, value):
                options["cache_group"] = value
            elif name == "weight" and float(value) > 0 and math.isfinite(float(value)):
                options["weight"] = float(value)
            elif name == "priority" and value.lstrip("-").isdigit():
                options["priority"] = int(value)
            else:
                raise ValueError(name)
        except ValueError:
            raise ConfigError(f"{where}: {word.split('=')[0]!r} is not tenant=NAME (letters, digits, _ . -), "
                              f"weight=W (a positive number), priority=P (an integer) or cache_group=NAME") from None
    return options


def parse_api_keys(text: str, separator: str | None = None, source: str = "the API keys file") -> dict[str, KeyEntry]:
    """`{key: KeyEntry}` from a keys file (lines: `KEY [TOKENS_PER_MINUTE] [tenant=NAME] [weight=W] [priority=P]
    [cache_group=NAME]`)
    or an env value (comma-separated, `key:tpm`).

    A bad entry is named by its place and the syntax its source expects; the key itself is never echoed."""
    keys: dict[str, KeyEntry] = {}
    from_env = separator == ","
    entries = text.split(",") if from_env else text.splitlines()
    for number, entry in enumerate(entries, 1):
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        parts = entry.replace(":", " ").split() if from_env else entry.split()
        quota = parts[1] if len(parts) > 1 and "=" not in parts[1] else None
        options = parts[2 if quota is not None else 1:]
        if (quota is not None and not (quota.isdigit() and int(quota) > 0)) or (from_env and options):
            if from_env:
                raise ConfigError(f"{source}: entry {number} is not KEY or KEY:TOKENS_PER_MINUTE (a positive "
                                  f"integer); expected e.g. KUBEINFER_API_KEYS=\"key1,key2:5000\"")
            raise ConfigError(f"{source}: line {number} is not KEY [TOKENS_PER_MINUTE] [tenant=NAME] [weight=W] "
                              f"[priority=P] [cache_group=NAME] (TOKENS_PER_MINUTE a positive integer)")
        tenant = Tenant(**{"name": key_tenant_name(parts[0]), **_options(options, f"{source}: line {number}")})
        keys[parts[0]] = KeyEntry(int(quota) if quota is not None else None, tenant)
    return keys


def load_api_keys(path: str | None, env: dict[str, str] | None = None) -> dict[str, KeyEntry]:
    env = os.environ if env is None else env
    keys = parse_api_keys(env.get("KUBEINFER_API_KEYS", ""), separator=",", source="KUBEINFER_API_KEYS")
    if path:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"API keys file {path!r} does not exist")
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"API keys file {path!r} cannot be read: {error}") from None
        keys |= parse_api_keys(text, source=f"API keys file {path!r}")
    return keys


@dataclass
class _Usage:
    events: deque = field(default_factory=deque)   # (time, tokens)
    total: int = 0


class KeyRing:
    def __init__(self, keys: dict[str, KeyEntry], default_tokens_per_minute: int | None = None):
        self.keys = keys
        self.default_tokens_per_minute = default_tokens_per_minute
        self._usage: dict[str, _Usage] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def authenticate(self, authorization: str | None) -> str | None:
        """The key the header carries, if it is one of ours; None otherwise (or when keys are off)."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        given = authorization[len("Bearer "):].strip().encode()
        for key in self.keys:   # compare every key in constant time
            if hmac.compare_digest(given, key.encode()):
                return key
        return None

    def limit(self, key: str | None) -> int | None:
        if key is None:
            return None
        entry = self.keys.get(key)
        limit = entry.tokens_per_minute if entry is not None else None
        return limit if limit is not None else self.default_tokens_per_minute

    def tenant(self, key: str | None) -> Tenant:
        entry = self.keys.get(key) if key is not None else None
        return entry.tenant if entry is not None else ANONYMOUS

    def _used(self, key: str, now: float) -> _Usage:
        usage = self._usage.setdefault(key, _Usage())
        while usage.events and usage.events[0][0] <= now - WINDOW_SECONDS:
            usage.total -= usage.events.popleft()[1]
        return usage

    def retry_after(self, key: str | None, tokens: int, now: float | None = None) -> float | None:
        """Seconds until `tokens` more fit in the key's minute; None when they fit now (or no quota)."""
        limit = self.limit(key)
        if limit is None:
            return None
        now = time.monotonic() if now is None else now
        usage = self._used(key, now)
        excess = usage.total + tokens - limit
        if excess <= 0:
            return None
        if tokens > limit:
            return WINDOW_SECONDS
        for when, amount in usage.events:
            excess -= amount
            if excess <= 0:
                return max(0.0, when + WINDOW_SECONDS - now)
        return WINDOW_SECONDS

    def charge(self, key: str | None, tokens: int, now: float | None = None) -> None:
        if key is None or tokens <= 0 or self.limit(key) is None:
            return
        now = time.monotonic() if now is None else now
        usage = self._used(key, now)
        usage.events.append((now, tokens))
        usage.total += tokens
