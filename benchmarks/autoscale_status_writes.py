"""Status writes per autoscale interval of a fleet of autoscaled InferenceServices, in process: no API server.

Each service is the autoscaler's own write step (`Autoscaler._decide_and_write`) against an in-memory object that
stores status as the API server does (a JSON merge patch) and counts its status PATCHes
(tests/support/autoscaler_loop.py). One pass per service per 5 s interval, 60 intervals (5 minutes), fixed seed.
Fleets: every service idle (replicas steady at minReplicas, no traffic), and one with a share of the services
busy (queue and running counts drawn each pass). The first 12 intervals are left out (the first metric window).

    python -P benchmarks/autoscale_status_writes.py [--services 200] [--busy-share 0.2]

The clock is the autoscaler module's `time` (not `Autoscaler.clock`), so the same script measures an older commit.
What it does not show: the API server's cost per write, and kopf's own writes (docs/benchmarks.md, "Operator at
fleet scale", measures those on a real API server).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kubeinfer.operator.autoscaling import autoscaler as autoscaler_module  # noqa: E402
from kubeinfer.operator.autoscaling.signals.measured import Signals  # noqa: E402
from support.autoscaler_loop import INTERVAL, T0, autoscaler, idle, service  # noqa: E402

INTERVALS, SETTLE = 60, 12


def busy_signals(rng: random.Random):
    queue, running = rng.choice((0.0, 1.0, 3.0, 6.0)), float(rng.randint(2, 12))
    return lambda now: Signals(now, queue_depth=queue, num_running=running, request_rate=running / 4,
                               num_pods_reporting=2)


def fleet_writes(services: int, busy_share: float, seed: int = 0) -> list[int]:
    """Status writes of the whole fleet in each interval."""
    rng = random.Random(seed)
    clock = types.SimpleNamespace(now=T0)
    autoscaler_module.time = types.SimpleNamespace(time=lambda: clock.now)  # type: ignore[assignment]
    fleet = [service(replicas=2, minReplicas=2) for _ in range(services)]
    scalers = [autoscaler(s) for s in fleet]
    busy = set(rng.sample(range(services), round(busy_share * services)))
    per_interval = []
    for i in range(INTERVALS):
        clock.now = T0 + INTERVAL * i
        before = sum(s.status_writes for s in fleet)
        for n, (stored, scaler) in enumerate(zip(fleet, scalers)):
            stored.now = clock.now
            signals = busy_signals(rng) if n in busy else idle
            scaler._decide_and_write(signals(clock.now))
        per_interval.append(sum(s.status_writes for s in fleet) - before)
    return per_interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--busy-share", type=float, default=0.2)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    for label, share in (("idle", 0.0), (f"{args.busy_share:.0%} busy", args.busy_share)):
        writes = fleet_writes(args.services, share)[SETTLE:]
        print(f"{args.services} services, {label}: {sum(writes) / len(writes):.1f} status writes per "
              f"{INTERVAL:g} s interval (min {min(writes)}, max {max(writes)}, first {SETTLE} intervals left out)")


if __name__ == "__main__":
    main()
