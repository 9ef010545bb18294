"""The multi-model simulator of the model pool's yardstick (operator/autoscaling/simulator/multi_model.py; the table is
benchmarks/model_pool_trace.py): every request is answered in every layout, a pool never holds more awake models per
pod than it may, a pool with a pod per model and free swaps is the always-on fleet, and scale-to-zero bills what it
keeps up."""

from __future__ import annotations

import math
from pathlib import Path

import pytest


from kubeinfer.operator.autoscaling.simulator.multi_model import MultiModelSim, multi_model_trace, zipf_weights
from kubeinfer.operator.autoscaling.simulator.trace_file import read_requests

TRACE = Path(__file__).resolve().parents[2] / "benchmarks" / "autoscale" / "traces" / "bursty_conversation.csv"
MODELS = 6


@pytest.fixture(scope="module")
def base():
    return [(t, min(p, 2048), min(o, 64)) for t, p, o in read_requests(TRACE)]


def trace(base, seed=0):
    return multi_model_trace(base, MODELS, 1.0, 400, seed, hours=1.0)


def test_the_trace_follows_zipf_and_keeps_every_model(base):
    requests = trace(base)
    counts = [sum(r.model == m for r in requests) for m in range(MODELS)]
    assert all(counts) and counts[0] > 2 * counts[-1]
    assert abs(len(requests) - 400) < 80 and max(r.arrival for r in requests) < 3600
    assert math.isclose(sum(zipf_weights(MODELS, 1.0)), 1.0)


@pytest.mark.parametrize("layout, pods, awake", [("always_on", 0, 1), ("scale_to_zero", 0, 1), ("pool", 2, 1),
                                                 ("pool", 2, 2), ("pool", 1, 3)])
def test_every_request_is_answered_and_a_pod_never_holds_more_awake_than_it_may(base, layout, pods, awake):
    sim = MultiModelSim(trace(base), MODELS, layout, pods=pods, swap_s=1.0, cold_start_s=30.0, idle_s=60.0,
                        awake_per_pod=awake).run()
    assert all(r.first_token >= r.arrival and r.generated == r.output for r in sim.requests)
    assert sim.most_awake <= awake
    if layout == "pool" and pods * awake < MODELS:
        assert sim.swaps > MODELS   # models came back after being put to sleep


def test_a_pool_with_a_pod_per_model_and_free_swaps_is_the_always_on_fleet(base):
    always = MultiModelSim(trace(base), MODELS, "always_on").run()
    pool = MultiModelSim(trace(base), MODELS, "pool", pods=MODELS, swap_s=0.0).run()
    assert [r.first_token for r in pool.requests] == [r.first_token for r in always.requests]
    assert pool.swaps == MODELS and pool.billed_s == always.billed_s


def test_scale_to_zero_never_idle_bills_each_model_from_its_first_request(base):
    requests = trace(base)
    sim = MultiModelSim(requests, MODELS, "scale_to_zero", cold_start_s=10.0, idle_s=1e9).run()
    first = {m: min(r.arrival for r in requests if r.model == m) for m in range(MODELS)}
    assert sim.cold_starts == MODELS
    assert math.isclose(sim.billed_s, sum(sim.duration - t for t in first.values()))
    assert min(r.first_token - r.arrival for r in requests if r.arrival in first.values()) >= 10.0
