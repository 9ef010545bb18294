"""Small parsers of the command line: log levels, LoRA modules, ports, OS errors in one line, and the flags that
`serve` and `router` share."""
import argparse
import logging
import os

from kubeinfer.runtime.errors import ConfigError


def os_error_line(error: OSError) -> str:
    """`[Errno 13] Permission denied: '/models/x/config.json'` in words: what failed, on which path."""
    what = error.strerror or type(error).__name__
    path = f" {error.filename}" if error.filename else ""
    detail = "" if error.strerror else f": {error}"
    return f"cannot access{path}: {what}{detail}"


def log_level(name: str) -> str:
    level = name.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"log level {name!r}: expected debug, info, warning, error or critical")
    return level


def named_values(items: list[str], flag: str, value: str, kind: str) -> dict[str, str]:
    """`NAME=VALUE ...` of `flag` -> {name: value}, in order; a bad item or a name given twice is a ConfigError
    (`value`: what VALUE is, e.g. PATH; `kind`: what NAME names, e.g. adapter)."""
    named = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise ConfigError(f"{flag} {item!r}: expected NAME={value}")
        if name in named:
            raise ConfigError(f"{flag}: {kind} {name!r} is given twice")
        named[name] = text
    return named


def parse_lora_modules(items: list[str]) -> dict[str, str]:
    """`NAME=PATH ...` (vLLM's --lora-modules form) -> {name: path}."""
    return named_values(items, "--lora-modules", "PATH", "adapter")


def parse_pool_models(items: list[str]) -> dict[str, int]:
    """`NAME=PORT ...` (`kubeinfer router --pool-model`) -> {name: port}."""
    models = named_values(items, "--pool-model", "PORT", "model")
    bad = [f"{name}={port}" for name, port in models.items() if not port.strip().isdigit()]
    if bad:
        raise ConfigError(f"--pool-model {bad[0]!r}: expected NAME=PORT")
    return {name: int(port) for name, port in models.items()}


def port_number(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {port}")
    return port


def add_trusted_header_args(parser: argparse.ArgumentParser) -> None:
    """A gateway's tenant header (runtime/server/trusted_header.py), for `serve` and `router`."""
    from kubeinfer.runtime.config import KV_SOURCE_NETWORKS
    parser.add_argument("--trusted-tenant-header", default=os.environ.get("KUBEINFER_TRUSTED_TENANT_HEADER"),
                        metavar="NAME", help="a header that names the request's tenant, believed only from "
                                             "--trusted-tenant-networks (a gateway that authenticates users); off by "
                                             "default [env KUBEINFER_TRUSTED_TENANT_HEADER]")
    networks = os.environ.get("KUBEINFER_TRUSTED_TENANT_NETWORKS")
    parser.add_argument("--trusted-tenant-networks", type=comma_list,
                        default=comma_list(networks) if networks else list(KV_SOURCE_NETWORKS),
                        help="comma-separated CIDRs the header is believed from [env KUBEINFER_TRUSTED_TENANT_NETWORKS; "
                             "default loopback and the private networks]")


def add_tracing_args(parser: argparse.ArgumentParser) -> None:
    """Where traces go (runtime/tracing.py), for `serve` and `router`."""
    parser.add_argument("--otlp-traces-endpoint", default=os.environ.get("KUBEINFER_OTLP_TRACES_ENDPOINT"),
                        metavar="URL", help="send OpenTelemetry traces to this OTLP/HTTP collector (http://HOST:4318); "
                                            "the standard OTEL_EXPORTER_OTLP_* variables work too; off when neither "
                                            "is set [env KUBEINFER_OTLP_TRACES_ENDPOINT]")


def start_tracing(service: str, endpoint: str | None) -> None:
    """Turns tracing on when a collector is named; a bad URL is a clear start-up error."""
    from kubeinfer.runtime import tracing
    try:
        if endpoint:   # the engine process (spawned) finds it where the SDK looks
            os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = tracing.traces_url(endpoint)
        if tracing.configure(service, endpoint):
            logging.getLogger("kubeinfer.tracing").info("sending traces to %s", tracing.traces_url(
                endpoint or tracing.endpoint_from_environment()))
    except ValueError as error:
        raise ConfigError(str(error)) from None


def comma_list(text: str) -> list[str]:
    """`a, b,,c` -> ["a", "b", "c"] (comma-separated flags and their environment variables)."""
    return [part.strip() for part in text.split(",") if part.strip()]
