"""The simulator's causal limit (autoscaling/simulator/causal.py): the present rate's fleet, nothing of the future."""

from __future__ import annotations



from kubeinfer.operator.autoscaling.simulator.causal import CausalLimitPolicy, present_rate
from kubeinfer.operator.autoscaling.simulator.clairvoyant import ClairvoyantPolicy
from kubeinfer.operator.autoscaling.simulator.policies import TableSizing
from kubeinfer.operator.autoscaling.simulator.scenarios import burst, steady, summarize
from kubeinfer.operator.autoscaling.simulator.sim import ReplicaModel, Simulation
from kubeinfer.operator.autoscaling.simulator.trace_file import load_trace
from kubeinfer.operator.autoscaling.sizing.fleet_sizing import fleet_sizing

TARGET = 0.5
MODEL = ReplicaModel(cold_start_s=30.0)
STEP = burst(base=1.5, factor=8.0, start_s=240.0, length_s=240.0, duration_s=900.0)


def test_it_orders_nothing_before_a_step_and_the_steps_fleet_at_it():
    sizing = fleet_sizing(TARGET, MODEL, 12, STEP.peak_rate)
    base_fleet, step_fleet = sizing.replicas_for(1.5), sizing.replicas_for(STEP.peak_rate)
    assert step_fleet > base_fleet
    no_drain = CausalLimitPolicy(STEP, sizing, MODEL.cold_start_s, max_replicas=12, drain=False)
    drained = CausalLimitPolicy(STEP, sizing, MODEL.cold_start_s, max_replicas=12, drain_s=20.0)
    before = [t / 2 for t in range(0, 2 * 240)]
    # Nothing of the step before it: the base rate's fleet up to its last instant, whatever the clairvoyant orders.
    assert {no_drain.need(t) for t in before} == {drained.need(t, 0, base_fleet) for t in before} == {base_fleet}
    assert ClairvoyantPolicy(STEP, sizing, MODEL.cold_start_s).need(240.0 - MODEL.cold_start_s, 240.0) == step_fleet
    # At the step: its rate's fleet; draining, also the backlog the base fleet leaves over a cold start, in 20 s.
    assert no_drain.need(240.0) == step_fleet
    table = TableSizing(sizing)
    backlog = (STEP.peak_rate - table.capacity(base_fleet)) * MODEL.cold_start_s
    assert drained.need(240.0, 0, base_fleet) == min(12, table.replicas_for(STEP.peak_rate + backlog / 20.0))
    assert drained.need(240.0, 0, base_fleet) > step_fleet
    # Back at the base rate with the backlog gone and the batches empty, it releases at once.
    assert drained.need(480.0, 0, step_fleet) == no_drain.need(480.0) == base_fleet


def test_a_drained_backlog_still_in_the_batches_holds_its_replicas():
    """Once a step's backlog has left the queue it is in the batches: released then, the fleet left could admit no
    arrival until those finish, and would order again (one more cold start). The present rate alone would release."""
    sizing = fleet_sizing(TARGET, MODEL, 12, STEP.peak_rate)
    drained = CausalLimitPolicy(STEP, sizing, MODEL.cold_start_s, max_replicas=12, batch_cap=MODEL.max_batch)
    base_fleet = sizing.replicas_for(1.5)
    assert drained.need(500.0, 0, 9, 8 * MODEL.max_batch) == 8 > base_fleet
    assert drained.need(500.0, 0, 9, 0) == base_fleet
    assert CausalLimitPolicy(STEP, sizing, MODEL.cold_start_s, drain=False).need(500.0) == base_fleet


def test_in_the_simulator_its_first_order_is_at_the_step_and_the_steps_fleet():
    sizing = fleet_sizing(TARGET, MODEL, 12, STEP.peak_rate)
    for policy in (CausalLimitPolicy(STEP, sizing, MODEL.cold_start_s, max_replicas=12, drain=False),
                   CausalLimitPolicy(STEP, sizing, MODEL.cold_start_s, max_replicas=12)):
        sim = Simulation(STEP, policy, initial_replicas=sizing.replicas_for(1.5), model=MODEL, seed=2).run()
        ups = [(t, after) for t, before, after in sim.scale_events if after > before]
        assert ups[0][0] == 240.0, ups   # the first tick at the step, none before (ticks every second)
        assert ups[0][1] >= sizing.replicas_for(STEP.peak_rate)


def test_on_a_steady_trace_it_is_the_clairvoyant_limit():
    """Tolerance 0.1 point of SLO share and 1% of GPU-hours: with a constant rate nothing lies ahead to see, and the
    drain must not take a steady fleet's noise for a backlog."""
    trace = steady(6.0, 900.0)
    sizing = fleet_sizing(TARGET, MODEL, 12, trace.peak_rate)
    fleet = sizing.replicas_for(6.0)
    limit = summarize(Simulation(trace, ClairvoyantPolicy(trace, sizing, MODEL.cold_start_s), fleet, MODEL,
                                 seed=3).run(), TARGET, warmup_s=0)
    for policy in (CausalLimitPolicy(trace, sizing, MODEL.cold_start_s, max_replicas=12),
                   CausalLimitPolicy(trace, sizing, MODEL.cold_start_s, max_replicas=12, drain_s=20.0),
                   CausalLimitPolicy(trace, sizing, MODEL.cold_start_s, max_replicas=12, drain=False)):
        causal = summarize(Simulation(trace, policy, fleet, MODEL, seed=3).run(), TARGET, warmup_s=0)
        assert abs(causal.slo_share - limit.slo_share) <= 0.001, (causal, limit)
        assert abs(causal.gpu_hours / limit.gpu_hours - 1) <= 0.01, (causal, limit)


def test_on_a_replayed_trace_it_reads_no_request_after_now(tmp_path):
    """A replayed trace's rate counts a window centred on t; the causal limit counts the window that ends at t."""
    times = [0.1 * i for i in range(600)] + [60.0 + 0.01 * i for i in range(3000)]   # 10 req/s, then 100 from 60 s
    full, cut = tmp_path / "full.csv", tmp_path / "cut.csv"
    for path, upto in ((full, 1e9), (cut, 55.0)):
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" +
                        "".join(f"{t:.3f},100,10\n" for t in times if t <= upto))
    whole, known = load_trace(full), load_trace(cut)
    for t in (40.0, 50.0, 55.0):
        assert present_rate(whole, t) == present_rate(known, t)
    assert present_rate(whole, 55.0) == 10.0
    assert present_rate(whole, 55.0, centred=True) > present_rate(known, 55.0, centred=True)   # it reads ahead
