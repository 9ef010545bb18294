"""The policies the autoscaling sweep compares on one trace (`make_policies`), one trace's run of them all
(`run_trace`), and the goals they are held to (`goal_line`, `limit_line`). benchmarks/autoscale_sim.py and
benchmarks/autoscale_sweep.py print them; the tests run them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from kubeinfer.operator.autoscaling.simulator.causal import CAUSAL, CAUSAL_DRAIN_20, CAUSAL_NO_DRAIN, CausalLimitPolicy
from kubeinfer.operator.autoscaling.simulator.clairvoyant import ClairvoyantPolicy
from kubeinfer.operator.autoscaling.simulator.policies import (
    FixedFleet,
    KubeInferPolicy,
    MovingAverageConcurrency,
    OperatorPredictivePolicy,
    PredictivePolicy,
    StablePanic,
    TableSizing,
)
from kubeinfer.operator.autoscaling.simulator.scenarios import (
    concurrency_per_replica,
    replicas_for_rate,
    saturation_throughput,
)
from kubeinfer.operator.autoscaling.sizing.fleet_sizing import fleet_sizing, sizing_share
from kubeinfer.operator.autoscaling.policies.predictive import PredictiveConfig
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig
from kubeinfer.operator.autoscaling.simulator.sim import ReplicaModel, Simulation, Trace

TTFT_TARGET_S = 0.5
MIN_REPLICAS, MAX_REPLICAS = 1, 20
# spec.autoscaling.initialDelaySeconds as the user wrote it: ours learns the real cold start from the
# replicas it creates and uses that instead once the first one is ready.
INITIAL_DELAY_S = 60
CLAIRVOYANT = "clairvoyant (knows the trace)"
LIMITS = (CLAIRVOYANT, CAUSAL, CAUSAL_DRAIN_20, CAUSAL_NO_DRAIN)   # the schedules read off the trace, not policies


def make_policies(trace: Trace, model: ReplicaModel) -> list:
    # Every autoscaler gets the same knowledge of a replica, from one-replica runs on this replica
    # model: the concurrency baselines a per-replica target (the mean in-flight requests of one replica
    # at the highest rate it serves with 99% of TTFTs within target), ours the saturation throughput as
    # spec.autoscaling.throughputPerReplica (what benchmarks/serve.py at a high rate measures). Ours
    # also runs without it, learning the throughput on its own. The clairvoyant limit sizes its fleet
    # with the table the fixed fleet is sized by.
    # A replayed trace's calibration uses its own request lengths: sized for the simulator's default requests,
    # the "limit" and the peak-sized fleet would bound nothing on it.
    # Sized for 99% of the requests a fleet can answer in time (a prompt whose prefill alone takes longer
    # than the target is a miss whatever the fleet).
    lengths = trace.lengths
    share = sizing_share(lengths, TTFT_TARGET_S, model)
    target_concurrency = concurrency_per_replica(TTFT_TARGET_S, model, share, lengths=lengths)
    config = PolicyConfig(min_replicas=MIN_REPLICAS, max_replicas=MAX_REPLICAS, target_ttft_p95_seconds=TTFT_TARGET_S,
                          initial_delay_seconds=INITIAL_DELAY_S, max_num_seqs=model.max_batch,
                          max_num_batched_tokens=model.prefill_token_budget)
    sizing = fleet_sizing(TTFT_TARGET_S, model, MAX_REPLICAS, trace.peak_rate, share, lengths=lengths)
    return [
        FixedFleet(replicas_for_rate(trace.peak_rate, TTFT_TARGET_S, model, share, lengths=lengths)),
        KubeInferPolicy(dataclasses.replace(config, assumed_throughput_per_replica=saturation_throughput(
            model, lengths=lengths)),
                        name="kubeinfer, throughputPerReplica given"),
        KubeInferPolicy(config, name="kubeinfer, learning throughput"),
        MovingAverageConcurrency(target_concurrency, MIN_REPLICAS, MAX_REPLICAS),
        MovingAverageConcurrency(target_concurrency, MIN_REPLICAS, MAX_REPLICAS, window_s=60.0,
                                 name="KubeAI-style, 60 s window"),
        StablePanic(target_concurrency, MIN_REPLICAS, MAX_REPLICAS),
        ClairvoyantPolicy(trace, sizing, model.cold_start_s, MIN_REPLICAS, name=CLAIRVOYANT),
        PredictivePolicy(TableSizing(sizing), PredictiveConfig(MIN_REPLICAS, MAX_REPLICAS),
                         initial_cold_start_s=INITIAL_DELAY_S),
        # What `autoscaling.policy: predictive` runs in the operator: sized by the replica model it calibrates from
        # the replicas' metrics, and until then by the throughput per replica (given, as for the reactive row above).
        OperatorPredictivePolicy(dataclasses.replace(config, assumed_throughput_per_replica=saturation_throughput(
            model, lengths=lengths))),
        # The limit without its look-ahead (causal.py): the present rate's fleet by the same table, the
        # backlog a step leaves drained as fast as the maximum fleet allows, by the predictive policy's 20 s, or not.
        CausalLimitPolicy(trace, sizing, model.cold_start_s, MIN_REPLICAS, MAX_REPLICAS, model.max_batch),
        CausalLimitPolicy(trace, sizing, model.cold_start_s, MIN_REPLICAS, MAX_REPLICAS, model.max_batch,
                          drain_s=PredictiveConfig.drain_s, name=CAUSAL_DRAIN_20),
        CausalLimitPolicy(trace, sizing, model.cold_start_s, MIN_REPLICAS, MAX_REPLICAS, model.max_batch, drain=False,
                          name=CAUSAL_NO_DRAIN),
    ]


def run_trace(trace: Trace, model: ReplicaModel, seed: int,
              only: Callable[[str], bool] = lambda name: True) -> list[tuple[Simulation, float] | None]:
    """Every policy on one trace, with the wall seconds each took: the fixed fleet starts at its size,
    the others at the size for the trace's starting rate. A policy whose name `only` refuses is not run (None)."""
    n0 = replicas_for_rate(max(trace.rate(0.0), 0.25), TTFT_TARGET_S, model,
                           sizing_share(trace.lengths, TTFT_TARGET_S, model), lengths=trace.lengths)
    runs: list[tuple[Simulation, float] | None] = []
    for policy in make_policies(trace, model):
        if not only(policy.name):
            runs.append(None)
            continue
        start = time.perf_counter()
        initial = policy.replicas if isinstance(policy, FixedFleet) else n0
        sim = Simulation(trace, policy, initial_replicas=initial, model=model, seed=seed).run()
        runs.append((sim, time.perf_counter() - start))
    return runs


def goal_line(results: list) -> str:
    """Ours (the first kubeinfer row) against the goal: SLO attainment at least that of the best
    autoscaling alternative, fewer GPU-hours than the fixed fleet."""
    fixed, ours = results[0], results[1]
    alternatives = [r for r in results[2:] if not r.policy.startswith("kubeinfer") and r.policy not in LIMITS]
    best = max(alternatives, key=lambda r: r.slo_share)
    slo_ok = round(ours.slo_share, 3) >= round(best.slo_share, 3)
    gpu_ok = ours.gpu_hours < fixed.gpu_hours
    return (f"{ours.trace}: SLO {100 * ours.slo_share:.1f}% vs best alternative {100 * best.slo_share:.1f}% "
            f"({best.policy}) {'ok' if slo_ok else 'MISSED'}; GPU-hours {ours.gpu_hours:.2f} vs fixed "
            f"{fixed.gpu_hours:.2f} {'ok' if gpu_ok else 'MISSED'}")


# How close to the clairvoyant limit ours must come (issue #17): SLO share within this many points...
LIMIT_SLO_POINTS = 2.0
# ... at no more than this multiple of its GPU-hours.
LIMIT_GPU_RATIO = 1.10


def limit_line(results: list, cold_start_s: float) -> str:
    """Ours (the first kubeinfer row) against the clairvoyant limit."""
    ours = results[1]
    limit = next(r for r in results if r.policy == CLAIRVOYANT)
    gap = 100 * (limit.slo_share - ours.slo_share)
    ratio = ours.gpu_hours / limit.gpu_hours
    return (f"{ours.trace}, cold start {cold_start_s:g} s: SLO {100 * ours.slo_share:.1f}% vs limit {100 * limit.slo_share:.1f}% "
            f"({gap:+.1f} points) {'ok' if gap <= LIMIT_SLO_POINTS else 'MISSED'}; GPU-hours {ours.gpu_hours:.2f} = "
            f"{100 * ratio:.0f}% of the limit's {limit.gpu_hours:.2f} {'ok' if ratio <= LIMIT_GPU_RATIO else 'MISSED'}")
