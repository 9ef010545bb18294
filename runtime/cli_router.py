"""`kubeinfer router`'s flags and its start (docs/router.md): the router's own part of the command line."""
import argparse

from kubeinfer.runtime.cli_lines import add_tracing_args, add_trusted_header_args, port_number, start_tracing
from kubeinfer.runtime.errors import ConfigError

# Router settings exposed as flags: (flag, type, default, help). Defaults are RouterSettings' and Weights'.
ROUTER_FLAGS = [
    ("policy", str, "prefix", "prefix: prefix affinity within bounded load; round-robin; least-load"),
    ("prefix-weight", float, 1.0, "score per share of the prompt's prefix chunks a replica was sent"),
    ("load-weight", float, 0.5, "score taken per share of the busiest replica's load (in flight + waiting)"),
    ("kv-weight", float, 0.25, "score taken per share of a replica's KV cache in use"),
    ("load-bound-epsilon", float, 1.0, "skip replicas above (1 + this) x the mean requests in flight"),
    ("footprint-weight", float, 0.25, "score taken per share of the most prefix text sent to one replica"),
    ("chunk-chars", int, 64, "characters per prefix chunk"),
    ("scrape-interval", float, 0.1, "seconds between scrapes of each replica's /metrics"),
    ("stale-after", float, 1.0, "seconds after which a replica's last scrape reads as fully loaded"),
    ("max-queued-requests", int, 1024, "requests that may wait for a ready replica before 429"),
    ("max-queued-bytes", int, 64 << 20, "bytes of request bodies that may wait before 429"),
    ("queue-timeout", float, 60.0, "seconds a request may wait for a ready replica before 503"),
    ("served-model-name", str, None, "model /v1/models lists while no replica is up (default: the replicas')"),
    ("api-keys-file", str, None, "the replicas' API keys file: each request's tenant (the router checks no key)"),
    ("max-in-flight-per-tenant", int, None, "a tenant's requests open at the router at most; more get 429"),
    ("prefix-cache-sharing", str, "tenant", "the replicas' --prefix-cache-sharing (tenant or shared): prefix affinity "
                                            "keys prefixes as their caches do"),
    ("drain-timeout-seconds", float, 30.0, "on SIGTERM, how long open requests and streams may finish"),
]


def add_router_parser(commands) -> None:
    router = commands.add_parser("router", help="route OpenAI requests to replicas by prompt-prefix affinity")
    router.add_argument("--upstream", action="append", default=[], metavar="URL",
                        help="a replica, http://HOST:PORT (repeat for each)")
    router.add_argument("--service", help="instead of --upstream: the ready endpoints of this Kubernetes Service, "
                                          "watched (its EndpointSlices)")
    router.add_argument("--namespace", help="the Service's namespace [default: the pod's own, else default]")
    router.add_argument("--service-port-name", default="http", help="the Service's port to use [default http]")
    router.add_argument("--endpoints-file", metavar="PATH",
                        help="instead of --upstream: a file holding a JSON list of replica URLs, re-read when it "
                             "changes (the operator's router pods: docs/router.md)")
    router.add_argument("--prefill-upstream", action="append", default=[], metavar="URL",
                        help="disaggregated serving: a prefill replica (kubeinfer serve --kv-role prefill), "
                             "http://HOST:PORT (repeat for each); the replicas above are then the decode pool")
    router.add_argument("--prefill-service", help="instead of --prefill-upstream: the ready endpoints of this Service")
    router.add_argument("--prefill-endpoints-file", metavar="PATH",
                        help="instead of --prefill-upstream: a JSON list of prefill replica URLs, re-read")
    router.add_argument("--host", default="0.0.0.0", help="address to listen on [default 0.0.0.0]")
    router.add_argument("--port", type=port_number, default=8080, help="port to listen on [default 8080]")
    router.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                        help="LoRA adapters the service offers, as `kubeinfer serve` takes them (docs/lora.md)")
    for flag, kind, default, help_text in ROUTER_FLAGS:
        choices = {"policy": ("prefix", "round-robin", "least-load"),
                   "prefix-cache-sharing": ("tenant", "shared")}.get(flag)
        router.add_argument("--" + flag, dest=flag.replace("-", "_"), type=kind, default=default, choices=choices,
                            help=f"{help_text} [default {default}]")
    router.add_argument("--pool-model", action="append", default=[], metavar="NAME=PORT",
                        help="a model pool (docs/router.md): each replica above is a pod serving this model on this "
                             "port (repeat for each model); the router wakes the model a request names")
    router.add_argument("--pool-max-awake", type=int, default=1, help="a pool pod's models awake at once [default 1]")
    router.add_argument("--pool-sleep-level", type=int, default=1, choices=(1, 2),
                        help="the sleep level of a pool's idle models [default 1]")
    add_trusted_header_args(router)
    add_tracing_args(router)
    router.add_argument("--kv-source-key-file", metavar="PATH",
                        help="disaggregated serving: a key shared with the decode replicas (their --kv-source-key-file); "
                             "each KV-source hint is signed with it, so they pull only from sources this router named")
    router.set_defaults(run=_router)


def _router(args: argparse.Namespace) -> int:
    from kubeinfer.runtime.router.affinity import Weights
    from kubeinfer.runtime.router.discovery import default_namespace
    from kubeinfer.runtime.router.main import serve as serve_router
    from kubeinfer.runtime.cli_lines import parse_pool_models
    from kubeinfer.runtime.router.settings import RouterSettings, parse_lora_modules

    try:
        weights = Weights(args.prefix_weight, args.load_weight, args.kv_weight, args.load_bound_epsilon,
                          args.footprint_weight)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    settings = RouterSettings(args.upstream, args.policy, weights, args.chunk_chars,
                              scrape_interval=args.scrape_interval, stale_after=args.stale_after,
                              max_queued_requests=args.max_queued_requests, max_queued_bytes=args.max_queued_bytes,
                              queue_timeout=args.queue_timeout, served_model_name=args.served_model_name,
                              service=args.service, namespace=args.namespace or default_namespace(),
                              service_port_name=args.service_port_name, endpoints_file=args.endpoints_file,
                              api_keys_file=args.api_keys_file, max_in_flight_per_tenant=args.max_in_flight_per_tenant,
                              prefix_cache_sharing=args.prefix_cache_sharing,
                              trusted_tenant_header=args.trusted_tenant_header,
                              trusted_tenant_networks=tuple(args.trusted_tenant_networks),
                              lora_modules=parse_lora_modules(args.lora_modules),
                              prefill_upstreams=args.prefill_upstream, prefill_service=args.prefill_service,
                              prefill_endpoints_file=args.prefill_endpoints_file,
                              kv_source_key_file=args.kv_source_key_file,
                              pool_models=parse_pool_models(args.pool_model), pool_max_awake=args.pool_max_awake,
                              pool_sleep_level=args.pool_sleep_level)
    if not args.drain_timeout_seconds >= 0:
        raise ConfigError(f"--drain-timeout-seconds must be >= 0, got {args.drain_timeout_seconds}")
    start_tracing("kubeinfer-router", args.otlp_traces_endpoint)
    return serve_router(settings, args.host, args.port, args.log_level, args.drain_timeout_seconds)
