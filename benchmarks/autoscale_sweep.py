"""Sweep the replica cold start and put every policy beside the clairvoyant limit (issue #17).

    .venv/bin/python benchmarks/autoscale_sweep.py [--seed 0] [--cold-starts 60 30 15 5]
        [--trace-file PATH ...] [--compress-to SECONDS] [--rate-scale X] [--no-synthetic]
        [--traces NAME ...] [--policies TEXT ...] [--no-frontier]

`--trace-file` adds a row per file and cold start: a CSV of `TIMESTAMP,ContextTokens,GeneratedTokens` (the public
format of production traces; benchmarks/autoscale/traces holds two of our making), each request replayed with its
own lengths; every policy is calibrated, and the limit and the fixed fleet sized, on that trace's own requests.

For each cold start and trace, the same runs as benchmarks/autoscale_sim.py (ours learns the cold start
from the replicas it creates, with initialDelaySeconds left at 60), printed as one markdown row:
SLO share / GPU-hours per policy, then ours against the limit (points below its SLO share, share of its
GPU-hours), then the limit and the operator against the causal limit (simulator/causal.py: the
present rate's fleet, no look-ahead), then the clairvoyant frontier (simulator/frontier.py: the fewest GPU-hours
that reach each SLO share by schedules that know the trace): its top point, ours, the operator's and the reactive
policy's GPU-hours over the frontier's at their own shares, the policies that land beyond it (none, or the
frontier is no limit on that trace), and the goal read on the frontier for the operator and the reactive default:
the share the frontier holds on the rate-table limit's GPU-hours (a clairvoyant's share on the limit's budget: the
limit's own share or more), the policy's points below it (goal: <= 2) and its GPU-hours over the frontier's at
its own share (goal: <= 1.10x). Fixed seed; about 25 s per cold start on one CPU core, and 30-90 s more per
row for the frontier (`--no-frontier` skips it). `--traces` keeps the rows of the named traces, `--policies` the
columns whose policy name contains one of the texts (and the limits', which the last columns need); the other cells
print "-". A run does not depend on the others, so its cells are the full sweep's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kubeinfer.operator.autoscaling.simulator import roster
from kubeinfer.operator.autoscaling.simulator.frontier import Frontier, Point, against, beyond, share_within
from kubeinfer.operator.autoscaling.simulator.scenarios import ALL_TRACES, summarize
from kubeinfer.operator.autoscaling.simulator.sim import ReplicaModel
from kubeinfer.operator.autoscaling.simulator.trace_file import load_trace

COLUMNS = ("clairvoyant", "causal limit", "causal limit, 20 s drain", "causal limit, no drain",
           "kubeinfer predictive", "kubeinfer predictive (operator)", "kubeinfer, throughputPerReplica given",
           "kubeinfer, learning throughput", "KubeAI-style", "KubeAI-style, 60 s", "KPA-style", "fixed (peak-sized)")


FRONTIER_COLUMNS = ("frontier: its top share / GPU-hours", "ours vs frontier at its share",
                    "operator vs frontier at its share", "reactive vs frontier at its share", "beyond the frontier",
                    "frontier's share at the limit's GPU-hours", "operator's goal on the frontier",
                    "reactive's goal on the frontier")


def header(frontier: bool = True) -> str:
    names = " | ".join(COLUMNS)
    extra = f" {' | '.join(FRONTIER_COLUMNS)} |" if frontier else ""
    return (f"| trace | cold start (s) | {names} | ours vs limit: SLO points below, GPU-hours | goal | "
            f"operator vs limit | operator's goal | causal limit vs limit | operator vs causal limit | "
            f"operator vs causal limit, 20 s drain |{extra}\n"
            f"|{'---|' * (len(COLUMNS) + 9 + (len(FRONTIER_COLUMNS) if frontier else 0))}")


def frontier_cells(results: list, frontier: list[Point]) -> str:
    """The frontier's top point, ours, the operator's and the reactive default's GPU-hours over the frontier's at
    their own shares, and every policy that lands beyond it."""
    ours, operator, reactive = results[7], results[8], results[1]

    def ratio(r) -> str:
        return "-" if r is None else f"{against(r, frontier):.2f}x"

    top, limit = frontier[0], results[6]
    past = [r.policy for r in results if r is not None and beyond(r, frontier)]
    share = None if limit is None else share_within(frontier, limit.gpu_hours)

    def goal(r) -> str:
        if r is None or share is None:
            return "-"
        gap, ratio = 100 * (share - r.slo_share), against(r, frontier)
        missed = [what for what, ok in (("SLO missed", gap <= roster.LIMIT_SLO_POINTS),
                                        ("GPU-hours missed", ratio <= roster.LIMIT_GPU_RATIO)) if not ok]
        return f"{gap:+.1f}, {ratio:.2f}x: {', '.join(missed) or 'met'}"
    return (f" {100 * top.slo_share:.1f}% / {top.gpu_hours:.2f} | {ratio(ours)} | {ratio(operator)} | "
            f"{ratio(reactive)} | {', '.join(past) or 'none'} | "
            f"{'-' if share is None else f'{100 * share:.1f}%'} | {goal(operator)} | {goal(reactive)} |")


def frontier_for(trace, model, seed: int, results: list, progress=lambda line: None) -> list[Point]:
    """The trace's clairvoyant frontier (simulator/frontier.py), with the runs of the schedules that read the trace
    (the rate-table limit, the causal limits) among its points, refined where a policy lands beyond it."""
    frontier = Frontier(trace, model, roster.TTFT_TARGET_S, seed)
    limits = [Point(r.slo_share, r.gpu_hours, r.policy) for r in results
              if r is not None and r.policy in roster.LIMITS]
    points = frontier.build(limits, progress)
    for r in results:
        if r is not None and beyond(r, points):
            points = frontier.refine(r)
    return points


def row(results: list, cold_start_s: float) -> str:
    """One markdown row: results in roster.make_policies order (fixed, ours reactive, ours reactive
    learning, KubeAI, KubeAI 60 s, KPA, clairvoyant, ours predictive, ours predictive as the operator runs it, the
    causal limits: draining as fast as it may, in 20 s, not at all); "ours" against the limit is the predictive
    policy with the simulator's table, then the operator's; the last three columns put the causal limit against the
    limit and the operator against the causal limits (SLO points below, share of GPU-hours): what no causal policy
    reaches without replicas the present does not need, and what remains to the operator."""
    fixed, reactive, learning, kubeai, kubeai60, kpa, limit, ours, operator, causal, drain20, no_drain = results

    def cell(r) -> str:
        return "-" if r is None else f"{100 * r.slo_share:.1f}% / {r.gpu_hours:.2f}"

    def against(r, bound) -> str:
        if r is None or bound is None:
            return "-"
        return f"{100 * (bound.slo_share - r.slo_share):+.1f}, {100 * r.gpu_hours / bound.gpu_hours:.0f}%"

    def against_limit(r) -> tuple[str, str]:
        if r is None or limit is None:
            return "-", "-"
        gap = 100 * (limit.slo_share - r.slo_share)
        ratio = r.gpu_hours / limit.gpu_hours
        slo_ok, gpu_ok = gap <= roster.LIMIT_SLO_POINTS, ratio <= roster.LIMIT_GPU_RATIO
        goal = ", ".join(what for what, ok in (("SLO missed", slo_ok), ("GPU-hours missed", gpu_ok)) if not ok)
        return f"{gap:+.1f}, {100 * ratio:.0f}%", goal or "met"

    cells = " | ".join(cell(r) for r in (limit, causal, drain20, no_drain, ours, operator, reactive, learning, kubeai,
                                         kubeai60, kpa, fixed))
    trace = next(r.trace for r in results if r is not None)
    bounds = (against(causal, limit), against(operator, causal), against(operator, drain20))
    return (f"| {trace} | {cold_start_s:g} | {cells} | {' | '.join(against_limit(ours) + against_limit(operator))} | "
            f"{' | '.join(bounds)} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold-starts", type=float, nargs="+", default=[60.0, 30.0, 15.0, 5.0])
    ap.add_argument("--trace-file", type=Path, nargs="*", default=[], help="CSV traces to replay as well")
    ap.add_argument("--compress-to", type=float, default=None, help="replay each file's span in this many seconds")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="thin (< 1) or multiply (> 1) the files' requests")
    ap.add_argument("--no-synthetic", action="store_true", help="only the trace files")
    ap.add_argument("--traces", nargs="+", default=None, help="only these traces' rows (by name: steady, ...)")
    ap.add_argument("--policies", nargs="+", default=None,
                    help="only the policies whose name contains one of these texts (the limits always run)")
    ap.add_argument("--no-frontier", action="store_true", help="skip the frontier's columns (its runs take longest)")
    args = ap.parse_args(argv)
    traces = [] if args.no_synthetic else [make() for make in ALL_TRACES]
    traces += [load_trace(path, args.compress_to, args.rate_scale, args.seed) for path in args.trace_file]
    if args.traces is not None:
        traces = [t for t in traces if t.name in args.traces]

    def only(name: str) -> bool:
        return args.policies is None or name in roster.LIMITS or any(text in name for text in args.policies)
    print(header(not args.no_frontier), flush=True)
    for cold_start in args.cold_starts:
        model = ReplicaModel(cold_start_s=cold_start)
        for trace in traces:
            runs = roster.run_trace(trace, model, args.seed, only)
            results = [None if run is None else summarize(run[0], roster.TTFT_TARGET_S) for run in runs]
            line = row(results, cold_start)
            if not args.no_frontier:
                line += frontier_cells(results, frontier_for(trace, model, args.seed, results))
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
