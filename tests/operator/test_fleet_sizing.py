"""The fleet sizing on the replica model (`autoscaling.fleet_sizing`, `autoscaling.replica_model`): the table the
simulator's clairvoyant limit uses, and the same walk done on demand for the operator's predictive policy."""

from __future__ import annotations

import math

import pytest

from kubeinfer.operator.autoscaling.sizing.fleet_sizing import (
    ModelSizing, attainable_share, fleet_sizing, serves, sizing_share,
)
from kubeinfer.operator.autoscaling.sizing.replica_model import (
    ReplicaModel, steady_requests, steady_share, steady_shares,
)

CODE = tuple((p, o) for p in (800, 1500, 2000, 2600, 3300) for o in (10, 25, 60))   # long prompts, short outputs
MODEL = ReplicaModel()


def test_a_fleet_answers_in_time_at_a_light_load_and_not_when_overloaded():
    light = steady_requests(0.5, 600, CODE, seed=1)
    assert steady_share(1, light, 0.5, MODEL, 1500) > 0.9
    heavy = steady_requests(8.0, 300, CODE, seed=1)
    assert steady_share(1, heavy, 0.5, MODEL, 1200) < 0.2   # one replica prefills ~4 of these a second
    assert steady_share(4, heavy, 0.5, MODEL, 1200) > steady_share(2, heavy, 0.5, MODEL, 1200)
    # a slower prefill serves less
    slow = ReplicaModel(prefill_s_per_token=0.0002)
    assert steady_share(2, light, 0.5, slow, 1500) < steady_share(2, light, 0.5, MODEL, 1500)


def test_the_sizing_share_is_the_attainable_one_less_two_points():
    assert attainable_share(CODE, 0.5, MODEL) == 1.0   # 3,300 tokens: 0.42 s alone
    assert attainable_share(CODE, 0.3, MODEL) == pytest.approx(9 / 15)
    assert sizing_share(CODE, 0.3, MODEL) == pytest.approx(9 / 15 - 0.02)
    assert sizing_share(CODE, 0.5, MODEL) == pytest.approx(0.98)   # a service's own lengths: always 2 below
    assert sizing_share(None, 0.5, MODEL) == 0.99                   # the simulator's log-normal ones: 99%


def test_the_on_demand_sizing_answers_as_the_whole_table():
    share = sizing_share(CODE, 0.5, MODEL)
    table = fleet_sizing(0.5, MODEL, 6, 6.0, share, lengths=CODE)
    assert list(table.max_rates) == sorted(table.max_rates) and len(table.max_rates) >= 3
    lazy = ModelSizing(MODEL, CODE, 0.5, share, 6)
    rates = [0.1, 0.25, 0.5, 1.0, 1.3, 2.0, 2.6, 3.1, 4.0, 5.2]
    assert [lazy.replicas_for(r) for r in rates] == [table.replicas_for(r) for r in rates]
    assert [lazy.capacity(n) for n in range(1, 4)] == list(table.max_rates[:3])
    # each fleet serves what the table says it does, and not a grid step more
    for n, top in enumerate(table.max_rates[:3], start=1):
        assert top == 0.0 or serves(n, top, 0.5, MODEL, share, lengths=CODE)
        assert not serves(n, top + 0.25, 0.5, MODEL, share, lengths=CODE)


def test_past_the_ceiling_the_sizing_asks_for_more_than_it():
    lazy = ModelSizing(MODEL, CODE, 0.5, sizing_share(CODE, 0.5, MODEL), 2)
    assert lazy.replicas_for(50.0) == 3
    assert lazy.capacity(4) == pytest.approx(2 * lazy.capacity(2))


def test_the_capacity_of_a_fleet_not_walked_is_extrapolated_without_walking():
    lazy = ModelSizing(MODEL, CODE, 0.5, sizing_share(CODE, 0.5, MODEL), 20)
    assert lazy.replicas_for(1.0) == 2
    walk = lazy._walk()
    walked = (list(walk.max_rates), walk.rate)
    per_replica = max(r / n for n, r in enumerate([*walk.max_rates, walk.rate - 0.25], start=1))
    assert lazy.capacity(15) == pytest.approx(15 * per_replica) and per_replica > 0
    assert (list(walk.max_rates), walk.rate) == walked   # nothing walked for it


def test_a_table_is_the_same_whoever_walked_further_before():
    from kubeinfer.operator.autoscaling.sizing import fleet_sizing as fs
    share = sizing_share(CODE, 0.5, MODEL)
    fs._walk.cache_clear()
    fresh = [fs.fleet_sizing.__wrapped__(0.5, MODEL, 6, top, share, lengths=CODE) for top in (1.0, 2.6, 6.0)]
    fs._walk.cache_clear()   # the walk is shared: a table up to 6 req/s first, then the smaller ones from it
    assert [fs.fleet_sizing.__wrapped__(0.5, MODEL, 6, top, share, lengths=CODE) for top in (6.0, 2.6, 1.0)] \
        == fresh[::-1]
    assert fresh[0].max_rates[-1] <= 1.25 and len(fresh[2].max_rates) > len(fresh[0].max_rates)


def test_a_rate_past_the_walk_gets_the_tables_fleet_from_runs_at_that_rate():
    """A burst asks for a rate far past the walk: the answer is the table's (not the small fleets' rate per
    replica scaled up, which orders more), found without walking the table up to it."""
    from kubeinfer.operator.autoscaling.sizing import fleet_sizing as fs
    share = sizing_share(CODE, 0.5, MODEL)
    table = fleet_sizing(0.5, MODEL, 12, 10.0, share, lengths=CODE)
    fs._walk.cache_clear()
    lazy = ModelSizing(MODEL, CODE, 0.5, share, 12)
    walk = lazy._walk()
    for rate in (9.0, 10.0):
        assert lazy.replicas_for(rate) == table.replicas_for(rate)
    per_replica = max(r / n for n, r in enumerate([*walk.max_rates, walk.rate - 0.25], start=1))
    assert table.replicas_for(10.0) < math.ceil(10.0 / per_replica)   # what extrapolating would have ordered
    assert walk.rate <= 0.25 * (1 + 2 * fs.WALK_BUDGET) + 1e-9        # two questions' budget walked, no more


def test_the_inter_token_share_counts_each_decoding_sequence_per_step():
    """By hand, one replica (0.01 s a step, 1 ms a sequence, 0.1 ms a prompt token): A (100 tokens, 3 out) is
    prefilled in 0.02 s and decodes two tokens in steps of 0.011 s; B (1,000 tokens, 2 out) arrives at 0.025 s and
    is prefilled in the step after A's first decode, 0.111 s long, which A's last token waits; B then decodes its
    second token in 0.011 s. Three intervals, one over a 0.05 s target; B's first token 0.117 s after it came."""
    model = ReplicaModel(decode_base_s=0.01, decode_per_seq_s=0.001, prefill_s_per_token=0.0001)
    requests = [(0.0, 100, 3), (0.025, 1000, 2)]
    assert steady_shares(1, requests, 0.1, model, 10.0, itl_target_s=0.05) == pytest.approx((0.5, 2 / 3))
    assert steady_shares(1, requests, 0.1, model, 10.0)[1] == 1.0                      # no target
    assert steady_shares(1, requests, 0.1, model, 10.0, itl_target_s=0.011)[1] == pytest.approx(2 / 3)
    assert steady_shares(1, requests, 0.1, model, 10.0, itl_target_s=0.0109)[1] == 0.0


def test_an_itl_target_sizes_a_larger_fleet_where_steps_are_too_long():
    """Prompts of ~512 tokens are prefilled in steps of ~0.08 s that the decoding sequences wait: with a 0.05 s
    ITL target a fleet serves a rate only with fewer admissions and sequences per replica. A target every step
    meets sizes as the TTFT alone does; a fleet with the target never needs fewer replicas."""
    plain = ModelSizing(MODEL, None, 0.5, 0.99, 30)
    loose = ModelSizing(MODEL, None, 0.5, 0.99, 30, itl_target_s=1.0)
    tight = ModelSizing(MODEL, None, 0.5, 0.99, 30, itl_target_s=0.05)
    rates = (1.0, 5.0, 10.0, 20.0)
    assert [loose.replicas_for(r) for r in rates] == [plain.replicas_for(r) for r in rates]
    assert all(tight.replicas_for(r) >= plain.replicas_for(r) for r in rates)
    assert tight.replicas_for(10.0) > plain.replicas_for(10.0)
    n = tight.replicas_for(10.0)   # what it sizes holds the target; one replica fewer does not
    assert serves(n, 10.0, 0.5, MODEL, 0.99, itl_target_s=0.05)
    assert not serves(n - 1, 10.0, 0.5, MODEL, 0.99, itl_target_s=0.05)
