"""Compare autoscaling policies on the discrete-event simulator (kubeinfer.operator.autoscaling.simulator).

    .venv/bin/python benchmarks/autoscale_sim.py [--seed 0] [--cold-start 60] [--out benchmarks/autoscale/results]

Prints one markdown table (also written to OUT/table.md) and writes OUT/<trace>.png with replicas and
TTFT P95 over time per policy. Fixed seed; matplotlib (the `bench` extra) only for the plots.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from kubeinfer.operator.autoscaling.simulator.roster import TTFT_TARGET_S, goal_line, limit_line, run_trace
from kubeinfer.operator.autoscaling.simulator.scenarios import (
    ALL_TRACES,
    HEADER,
    concurrency_per_replica,
    saturation_throughput,
    summarize,
)
from kubeinfer.operator.autoscaling.simulator.sim import ReplicaModel, Simulation


def plot(trace_name: str, sims: list[Simulation], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_t) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for sim in sims:
        s = sim.samples
        ax_r.step([t / 60 for t in s.t], s.replicas, where="post", label=sim.policy.name, lw=1.2)
        bins: dict[int, list[float]] = {}
        for t, v in zip(sim.ttft_times, sim.ttft_values):
            bins.setdefault(int(t // 30), []).append(v)
        xs = sorted(bins)
        p95 = [sorted(bins[b])[max(0, math.ceil(0.95 * len(bins[b])) - 1)] for b in xs]
        ax_t.plot([(b * 30 + 15) / 60 for b in xs], p95, lw=1.0, label=sim.policy.name)
    rate = sims[0].trace.rate
    ax_rate = ax_r.twinx()
    ts = [i * 10 for i in range(int(sims[0].trace.duration_s / 10))]
    ax_rate.plot([t / 60 for t in ts], [rate(t) for t in ts], color="grey", ls=":", lw=1)
    ax_rate.set_ylabel("arrival rate (req/s, dotted)")
    ax_r.set_ylabel("replicas (ready + pending)")
    ax_r.legend(fontsize=8, loc="upper left")
    ax_t.axhline(TTFT_TARGET_S, color="black", ls="--", lw=0.8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("TTFT P95 per 30 s (s)")
    ax_t.set_xlabel("minutes")
    fig.suptitle(f"{trace_name}: replicas and TTFT P95 (target {TTFT_TARGET_S} s, dashed)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold-start", type=float, default=60.0, help="replica cold start, seconds")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "autoscale" / "results")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    model = ReplicaModel(cold_start_s=args.cold_start)
    args.out.mkdir(parents=True, exist_ok=True)
    target = concurrency_per_replica(TTFT_TARGET_S, model)
    print(f"calibrated on one replica: concurrency target {target:.1f} (batch cap {model.max_batch}), "
          f"saturation throughput {saturation_throughput(model):.2f} req/s", flush=True)
    lines, goals, limits = [HEADER], [], []
    print(HEADER, flush=True)
    for make_trace in ALL_TRACES:
        trace = make_trace()
        runs = run_trace(trace, model, args.seed)
        sims = [sim for sim, _ in runs]
        results = [summarize(sim, TTFT_TARGET_S) for sim in sims]
        for result, (_, seconds) in zip(results, runs):
            lines.append(result.row())
            print(lines[-1], f"<!-- {seconds:.1f}s -->", flush=True)
        goals.append(goal_line(results))
        limits.append(limit_line(results, model.cold_start_s))
        if not args.no_plots:
            plot(trace.name, sims, args.out / f"{trace.name.replace(' ', '_')}.png")
    print("\ngoal (kubeinfer, throughputPerReplica given):\n" + "\n".join(goals))
    print("\nagainst the clairvoyant limit:\n" + "\n".join(limits))
    (args.out / "table.md").write_text("\n".join(lines) + "\n\n" + "\n".join(f"- {g}" for g in goals + limits) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
