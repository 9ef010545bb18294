"""Smoke tests of the autoscaling simulator on short traces (the full comparison is
benchmarks/autoscale_sim.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from autoscale.policies import FixedFleet, KubeInferPolicy  # noqa: E402
from autoscale.scenarios import burst, diurnal, flash_crowd, replicas_for_rate, steady, summarize  # noqa: E402
from autoscale.sim import ReplicaModel, Simulation  # noqa: E402

from kubeinfer.operator.autoscale_types import PolicyConfig  # noqa: E402

TARGET = 0.5
MODEL = ReplicaModel(cold_start_s=30.0)


def test_peak_sized_fixed_fleet_holds_the_slo_and_one_replica_does_not():
    trace = steady(6.0, 300.0)
    n = replicas_for_rate(6.0, TARGET, MODEL)
    good = summarize(Simulation(trace, FixedFleet(n), n, MODEL, seed=1).run(), TARGET, warmup_s=0)
    assert good.slo_share >= 0.98 and good.num_requests > 1500
    assert abs(good.gpu_hours - n * 300 / 3600) < 1e-9
    if n > 1:
        bad = summarize(Simulation(trace, FixedFleet(n - 1), n - 1, MODEL, seed=1).run(), TARGET, warmup_s=0)
        assert bad.slo_share < good.slo_share


def test_our_policy_scales_up_soon_after_a_burst_and_back_down_after():
    trace = burst(base=1.5, factor=8.0, start_s=120.0, length_s=180.0, duration_s=900.0)
    policy = KubeInferPolicy(PolicyConfig(max_replicas=12, target_ttft_p95_seconds=TARGET,
                                          scale_down_stabilization_seconds=120, initial_delay_seconds=0))
    sim = Simulation(trace, policy, initial_replicas=1, model=MODEL, seed=2).run()
    r = summarize(sim, TARGET, warmup_s=0)
    # first scale-up within two ticks + one scrape of the burst's start
    assert r.first_scale_up_s is not None and r.first_scale_up_s <= 2 * policy.tick_s + policy.scrape_interval_s
    assert r.peak_replicas >= 3
    # after the burst (ends at 300 s) and the 120 s window, it comes back down
    assert sim.samples.replicas[-1] < r.peak_replicas
    # far better than staying at the starting size (the cold start still costs some requests)
    stay = summarize(Simulation(trace, FixedFleet(1), 1, MODEL, seed=2).run(), TARGET, warmup_s=0)
    assert r.slo_share > stay.slo_share + 0.2, (r.slo_share, stay.slo_share)


@pytest.mark.parametrize("make_trace", [diurnal, burst, flash_crowd], ids=lambda f: f.__name__)
def test_goal_on_the_benchmark_traces(make_trace):
    """The benchmark's claim (docs/benchmarks.md), seed 0: with throughputPerReplica, ours holds at
    least the SLO share of the best autoscaling alternative with fewer GPU-hours than the fixed fleet."""
    import autoscale_sim

    runs = autoscale_sim.run_trace(make_trace(), ReplicaModel(), seed=0)
    line = autoscale_sim.goal_line([summarize(sim, autoscale_sim.TTFT_TARGET_S) for sim, _ in runs])
    assert "MISSED" not in line, line
