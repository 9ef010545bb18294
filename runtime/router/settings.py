"""The router's settings: one typed object, checked once, handed down unchanged."""
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kubeinfer.runtime.config import KV_SOURCE_NETWORKS, PREFIX_CACHE_SHARING
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.router.affinity import Weights
from kubeinfer.runtime.cli_lines import parse_lora_modules  # noqa: F401  (one parser for both commands)

POLICIES = ("prefix", "round-robin", "least-load")


@dataclass
class RouterSettings:
    upstreams: list[str]
    policy: str = "prefix"
    weights: Weights = field(default_factory=Weights)
    chunk_chars: int = 64              # characters per prefix chunk (about a 16-token KV block of English text)
    max_chunks: int = 512              # prefix hashed at most this far (32 KiB of text by default)
    scrape_interval: float = 0.1       # seconds between two scrapes of each replica's /metrics
    stale_after: float = 1.0           # older scrape data reads as a fully loaded replica
    max_queued_requests: int = 1024    # requests that may wait for a ready replica ...
    max_queued_bytes: int = 64 << 20   # ... and their bodies' bytes
    queue_timeout: float = 60.0        # seconds a request may wait for a ready replica
    max_body_bytes: int = 16 << 20
    connect_timeout: float = 2.0
    served_model_name: str | None = None   # listed by /v1/models while no replica is up (else: the replicas')
    service: str | None = None         # discover the replicas: this Service's ready endpoints (EndpointSlices)
    namespace: str = "default"
    service_port_name: str = "http"
    endpoints_file: str | None = None  # discover the replicas: a JSON list of URLs in this file, re-read
    api_keys_file: str | None = None   # the replicas' keys file: who each request's tenant is (router/tenants.py)
    max_in_flight_per_tenant: int | None = None   # a tenant's requests open here at most (None: no cap)
    prefix_cache_sharing: str = "tenant"   # as the replicas' --prefix-cache-sharing: prefix affinity keys the same
    trusted_tenant_header: str | None = None   # a gateway's tenant header, believed from trusted_tenant_networks only
    trusted_tenant_networks: tuple[str, ...] = KV_SOURCE_NETWORKS
    lora_modules: dict[str, str] = field(default_factory=dict)   # adapters the service offers: name -> path on
                                                                 # the replicas' nodes (`--lora-modules NAME=PATH`)
    # Disaggregated serving (docs/disaggregation.md): a prefill pool, found like the replicas above (which are then
    # the decode pool) by one of these; none: every request is served colocated.
    prefill_upstreams: list[str] = field(default_factory=list)
    prefill_service: str | None = None
    prefill_endpoints_file: str | None = None
    kv_source_key_file: str | None = None   # signs each KV-source hint for the decode replicas (same file there)
    # A model pool (router/pool.py): the replicas above are the pool's pods, each running one engine per model on
    # that model's port; at most pool_max_awake awake per pod, the others asleep at pool_sleep_level.
    pool_models: dict[str, int] = field(default_factory=dict)   # model name -> port (`--pool-model NAME=PORT`)
    pool_max_awake: int = 1
    pool_sleep_level: int = 1

    @property
    def disaggregated(self) -> bool:
        return (bool(self.prefill_upstreams) or self.prefill_service is not None
                or self.prefill_endpoints_file is not None)

    def __post_init__(self):
        sources = sum((bool(self.upstreams), self.service is not None, self.endpoints_file is not None))
        if sources > 1:
            raise ConfigError("give one of --upstream URLs, --service or --endpoints-file")
        if sources == 0:
            raise ConfigError("no replica: give at least one --upstream URL, or --service, or --endpoints-file")
        if sum((bool(self.prefill_upstreams), self.prefill_service is not None,
                self.prefill_endpoints_file is not None)) > 1:
            raise ConfigError("give one of --prefill-upstream URLs, --prefill-service or --prefill-endpoints-file")
        self.upstreams = _clean_urls(self.upstreams, "--upstream")
        self.prefill_upstreams = _clean_urls(self.prefill_upstreams, "--prefill-upstream")
        if set(self.upstreams) & set(self.prefill_upstreams):
            raise ConfigError("a replica is in both pools: give it as --upstream (decode) or --prefill-upstream")
        if self.policy not in POLICIES:
            raise ConfigError(f"--policy {self.policy!r}: expected one of {', '.join(POLICIES)}")
        if self.prefix_cache_sharing not in PREFIX_CACHE_SHARING:
            raise ConfigError(f"--prefix-cache-sharing {self.prefix_cache_sharing!r}: expected one of "
                              f"{', '.join(PREFIX_CACHE_SHARING)}")
        if self.max_in_flight_per_tenant is not None and self.max_in_flight_per_tenant < 1:
            raise ConfigError(f"--max-in-flight-per-tenant must be >= 1, got {self.max_in_flight_per_tenant}")
        if self.served_model_name is not None and self.served_model_name in self.lora_modules:
            raise ConfigError(f"--lora-modules: {self.served_model_name!r} is the base model's served name")
        if self.pool_models:
            self._check_pool()
        for name in ("chunk_chars", "max_chunks", "max_queued_requests", "max_queued_bytes", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("scrape_interval", "stale_after", "queue_timeout", "connect_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")

    def _check_pool(self) -> None:
        if self.lora_modules or self.disaggregated:
            raise ConfigError("--pool-model does not go with --lora-modules or a prefill pool")
        if self.served_model_name is not None:
            raise ConfigError("--served-model-name does not go with --pool-model: the pool serves its models' names")
        ports = list(self.pool_models.values())
        if len(set(ports)) != len(ports) or not all(0 < port < 65536 for port in ports):
            raise ConfigError(f"--pool-model: each model needs a port of its own in 1-65535, got {self.pool_models}")
        if not 1 <= self.pool_max_awake:
            raise ConfigError(f"--pool-max-awake must be >= 1, got {self.pool_max_awake}")
        if self.pool_sleep_level not in (1, 2):
            raise ConfigError(f"--pool-sleep-level must be 1 or 2, got {self.pool_sleep_level}")


def _clean_urls(urls: list[str], flag: str) -> list[str]:
    cleaned = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"{flag} {url!r}: expected http://HOST:PORT (no path)")
        try:
            parts.port   # noqa: B018 - raises on a bad port
        except ValueError:
            raise ConfigError(f"{flag} {url!r}: bad port") from None
        cleaned.append(url.rstrip("/"))
    if len(set(cleaned)) != len(cleaned):
        raise ConfigError(f"the same {flag} is given twice")
    return cleaned
