"""The clairvoyant frontier (simulator/frontier.py): the fewest GPU-hours that reach each SLO share, a
limit no policy lands beyond."""

from __future__ import annotations

import math
import random
from pathlib import Path


from kubeinfer.operator.autoscaling.simulator import roster
from kubeinfer.operator.autoscaling.simulator.frontier import (
    CostClairvoyant,
    Frontier,
    Point,
    against,
    around,
    beyond,
    envelope,
    fewest_gpu_hours,
    request_cost,
    share_within,
)
from kubeinfer.operator.autoscaling.simulator.policies import FixedFleet
from kubeinfer.operator.autoscaling.simulator.scenarios import Result, steady, summarize
from kubeinfer.operator.autoscaling.simulator.sim import ReplicaModel, Simulation
from kubeinfer.operator.autoscaling.simulator.trace_file import load_trace

TARGET = 0.5
MODEL = ReplicaModel(cold_start_s=30.0)


def result(share: float, gpu_hours: float) -> Result:
    return Result("t", "p", 100, share, 0.1, 0.2, 0.3, gpu_hours, 1, 0, None)


def test_the_envelope_keeps_the_pareto_points_and_reads_as_a_staircase():
    points = [Point(0.90, 5.0, "a"), Point(0.80, 6.0, "dominated by a"), Point(0.95, 9.0, "b"),
              Point(0.70, 2.0, "c"), Point(0.95, 8.0, "b, cheaper"), Point(0.70, 2.5, "dominated by c")]
    frontier = envelope(points)
    assert [p.schedule for p in frontier] == ["b, cheaper", "a", "c"]
    assert fewest_gpu_hours(frontier, 0.60) == 2.0
    assert fewest_gpu_hours(frontier, 0.70) == 2.0
    assert fewest_gpu_hours(frontier, 0.75) == 5.0   # no interpolation: a share between two runs takes the dearer
    assert fewest_gpu_hours(frontier, 0.95) == 8.0
    assert fewest_gpu_hours(frontier, 0.96) == math.inf
    # Beyond: a share held with fewer GPU-hours than the frontier needs for it, past the tolerances.
    assert beyond(result(0.85, 4.5), frontier)
    assert not beyond(result(0.85, 5.0), frontier)
    assert not beyond(result(0.9005, 4.99), frontier)   # within 0.1 point and 1%
    assert beyond(result(0.97, 100.0), frontier)        # a share the frontier never reaches
    assert against(result(0.85, 7.5), frontier) == 1.5
    # The share a clairvoyant holds on a budget: the best point within it (and 1%).
    assert share_within(frontier, 5.0) == 0.90 and share_within(frontier, 4.96) == 0.90
    assert share_within(frontier, 4.9) == 0.70 and share_within(frontier, 1.0) == 0.0


def test_a_request_costs_its_prefill_and_its_decode_steps_at_a_full_batchs_share():
    model = ReplicaModel()
    assert request_cost(2000, 1, model) == 2000 * model.prefill_s_per_token
    per_token = model.decode_per_seq_s + model.decode_base_s / model.max_batch
    assert math.isclose(request_cost(100, 11, model), 100 * model.prefill_s_per_token + 10 * per_token)


def test_the_cost_schedule_sizes_for_a_cluster_of_prompts_and_orders_a_cold_start_ahead():
    model = ReplicaModel(cold_start_s=30.0)
    policy = CostClairvoyant(utilization=0.5, window_s=1.0, cold_start_s=30.0, model=model)
    arrivals = [100.0, 100.2, 100.4, 200.0]
    cost = request_cost(2000, 1, model)   # 0.24 s of a replica each
    policy.needs = policy.plan(arrivals, [cost] * 4, 300.0)
    assert policy.need(100.0, 100.0) == math.ceil(3 * cost / 0.5) == 2   # the cluster: 0.72 s of work in 1 s
    assert policy.need(150.0, 150.0) == 1                                # nothing to come: the minimum
    assert policy.need(199.5, 199.5) == 1                                # one prompt: one replica
    # At a tick, the largest need from now to a cold start and a tick ahead: ordered just in time.
    assert policy.need(69.0, 69.0 + 31.0) == 2 and policy.need(68.0, 68.0 + 31.0) == 1


def test_a_hindsight_plan_adds_a_replica_within_the_hold_of_each_miss():
    assert around([10.0, 11.0, 40.0], 2.0, 3, 1.0, 50) == [3] * 8 + [4] * 6 + [3] * 24 + [4] * 5 + [3] * 7
    assert around([], 2.0, 3, 1.0, 4) == [3] * 4


def test_on_steady_traffic_the_hindsight_schedule_lands_between_the_fixed_fleets_and_refine_finds_it():
    """The steady row at a 5 s cold start: a fixed fleet of 2 misses a few requests, 3 costs a whole replica more,
    and a policy whose fleet wanders between them (KubeAI's moving average) landed beyond a frontier without the
    hindsight schedules."""
    frontier = Frontier(steady(6.0, 900.0), ReplicaModel(cold_start_s=5.0), TARGET, seed=0, warmup_s=60.0)
    frontier.fixed = {n: frontier.run(FixedFleet(n, name=f"fixed, {n} replicas"), n) for n in (2, 3)}
    two, three = frontier.fixed[2], frontier.fixed[3]
    assert two.slo_share < three.slo_share
    point = frontier.hindsight_point(2, 15.0)
    assert point.slo_share > two.slo_share and two.gpu_hours < point.gpu_hours < three.gpu_hours, (point, two, three)
    # A policy that held what the hindsight schedule holds at a little more is beyond the fixed fleets alone; refine
    # runs the hindsight schedules around the fleet of 2 and holds it.
    frontier.points = [two, three]
    policy = result(point.slo_share, point.gpu_hours * 1.02)
    assert beyond(policy, envelope(frontier.points))
    refined = frontier.refine(policy)
    assert not beyond(policy, refined), refined
    assert any(p.schedule.startswith("clairvoyant: 2 replicas, 3 within") for p in refined), refined


def clustered_code_trace(path: Path, seed: int = 3, duration_s: float = 1200.0) -> Path:
    """Prefill-heavy traffic whose requests come in clusters (a code assistant: prompts around 2,000 tokens,
    answers around 30, several requests within a second of each other, as in public code-completion traces)."""
    rng = random.Random(seed)
    rows, t = [], 0.0
    while True:
        t += rng.expovariate(0.6)
        if t >= duration_s:
            break
        for _ in range(rng.choice((1, 1, 2, 3, 5))):
            prompt = int(min(3800, max(200, rng.lognormvariate(math.log(2000), 0.4))))
            rows.append((t + rng.random() * 0.4, prompt, max(1, int(rng.lognormvariate(math.log(30), 0.6)))))
    rows.sort()
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{a:.4f},{p},{o}\n" for a, p, o in rows))
    return path


def test_on_clustered_prefill_heavy_traffic_no_policy_lands_beyond_the_frontier(tmp_path):
    """The issue's failure, small: on clustered prefill-heavy traffic the rate-table limit holds a lower share
    than fixed fleets do, so it bounds nothing; the frontier holds every policy of the sweep's table (the limits'
    runs are among its points, as the sweep puts them)."""
    trace = load_trace(clustered_code_trace(tmp_path / "code.csv"))
    warmup = 60.0
    results = [summarize(sim, TARGET, warmup_s=warmup) for sim, _ in roster.run_trace(trace, MODEL, seed=0)]
    limit = next(r for r in results if r.policy == roster.CLAIRVOYANT)
    fixed = [summarize(Simulation(trace, FixedFleet(n, name=f"fixed {n}"), n, MODEL, seed=0).run(), TARGET,
                       warmup_s=warmup) for n in range(1, 9)]
    # The yardstick of before fails here: fixed fleets hold shares the limit does not reach.
    assert any(f.slo_share > limit.slo_share + 0.02 for f in fixed), (limit, fixed)

    frontier = Frontier(trace, MODEL, TARGET, seed=0, warmup_s=warmup)
    limits = [r for r in results if r.policy in roster.LIMITS]   # schedules read off the trace: points too
    assert len(limits) == 4
    points = frontier.build([Point(r.slo_share, r.gpu_hours, r.policy) for r in limits])
    for r in results:
        if beyond(r, points):
            points = frontier.refine(r)
    past = [(r.policy, r.slo_share, r.gpu_hours) for r in results if beyond(r, points)]
    assert not past, (past, points)
    # It reaches what the best fixed fleet reaches, and its cost schedules are on it: it is not the fixed fleets'.
    best_fixed = max(fixed, key=lambda r: r.slo_share)
    assert points[0].slo_share >= best_fixed.slo_share - 0.001
    assert any(p.schedule.startswith("clairvoyant by cost") for p in points), points
    # Every policy of the table, judged at its own share (the sweep's columns), costs at least the frontier's.
    assert all(against(r, points) >= 1 / (1 + 0.01) for r in results)
