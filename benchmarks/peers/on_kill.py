"""A benchmark that starts servers or an operator must not leave them behind when it is killed."""
import signal
import sys


def exit_on_sigterm() -> None:
    """`kill` (SIGTERM) becomes a normal exit, so `finally` blocks and `subprocess.run` stop what the benchmark
    started; without it Python dies at once and its children run on (a leftover server on the same port answered the
    next run's readiness check)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
