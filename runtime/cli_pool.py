"""`kubeinfer pool`: a model pool's pod, one `kubeinfer serve` per model (runtime/pool_launcher.py)."""
import argparse

from kubeinfer.runtime.cli_lines import named_values, port_number
from kubeinfer.runtime.errors import ConfigError


def add_pool_parser(commands) -> None:
    pool = commands.add_parser(
        "pool", help="serve several models from one pod, at most --max-awake awake (a model pool's pod)",
        description="Starts `kubeinfer serve` for each --member, model i on port PORT + i, one after the other; "
                    "all but the last --max-awake go to sleep once started. Flags after `--` go to every "
                    "`kubeinfer serve`. The router wakes the model each request names (kubeinfer router "
                    "--pool-model NAME=PORT).")
    pool.add_argument("--member", action="append", default=[], metavar="NAME=MODEL", required=True,
                      help="a model of the pool: its served name and its folder (repeat for each)")
    pool.add_argument("--max-awake", type=int, default=1, help="models awake at once [default 1]")
    pool.add_argument("--sleep-level", type=int, default=1, choices=(1, 2),
                      help="the level the others sleep at [default 1]")
    pool.add_argument("--host", default="0.0.0.0", help="address the engines listen on [default 0.0.0.0]")
    pool.add_argument("--port", type=port_number, default=8000, help="the first model's port [default 8000]")
    pool.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then flags for every `kubeinfer serve`")
    pool.set_defaults(run=_pool)


def parse_members(items: list[str]) -> dict[str, str]:
    return named_values(items, "--member", "MODEL", "model")


def _pool(args: argparse.Namespace) -> int:
    from kubeinfer.runtime.pool_launcher import PoolLauncher

    members = parse_members(args.member)
    if not 1 <= args.max_awake:
        raise ConfigError(f"--max-awake must be >= 1, got {args.max_awake}")
    if args.port + len(members) - 1 > 65535:
        raise ConfigError(f"--port {args.port}: {len(members)} models need ports up to {args.port + len(members) - 1}")
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    for flag in ("--model", "--served-model-name", "--port", "--host", "--sleep-at-start"):
        if any(arg == flag or arg.startswith(flag + "=") for arg in serve_args):
            raise ConfigError(f"{flag} is set by `kubeinfer pool` for each model: leave it out of the serve flags")
    return PoolLauncher(members, args.max_awake, args.sleep_level, args.host, args.port, serve_args,
                        args.log_level).run()
