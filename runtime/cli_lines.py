"""Small parsers of the command line: log levels, LoRA modules, ports, and OS errors in one line."""
import argparse

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


def parse_lora_modules(items: list[str]) -> dict[str, str]:
    """`NAME=PATH ...` (vLLM's --lora-modules form) -> {name: path}."""
    modules = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ConfigError(f"--lora-modules {item!r}: expected NAME=PATH")
        if name in modules:
            raise ConfigError(f"--lora-modules: adapter {name!r} is given twice")
        modules[name] = path
    return modules


def port_number(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {port}")
    return port
