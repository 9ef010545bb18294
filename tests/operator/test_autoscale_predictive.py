"""The predictive autoscaling policy's parts: the forecaster (Holt's trend with a spread of its errors, online,
its state a dict) and the decision (one cold start ahead, released by expected cost, guarded)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeinfer.operator.autoscaling.policies.forecast import Forecast, ForecastConfig, update
from kubeinfer.operator.autoscaling.policies.predictive import (
    PerReplicaSizing, PredictiveConfig, PredictiveState, decide,
)
from kubeinfer.operator.autoscaling.policies.return_gap import ReturnGap


def feed(rates, step=5.0, forecast=Forecast()):
    for i, rate in enumerate(rates):
        forecast = update(forecast, rate, i * step)
    return forecast


def test_a_steady_rate_is_forecast_flat_with_no_spread():
    f = feed([4.0] * 100)
    assert f.level == pytest.approx(4.0) and abs(f.trend) < 1e-9 and f.spread < 1e-6
    assert f.at(60) == pytest.approx(4.0) and f.high(60) == pytest.approx(4.0)


def test_a_ramp_is_extrapolated_one_cold_start_ahead():
    f = feed([1.0 + 0.01 * 5 * i for i in range(200)])   # +0.01 req/s every second
    assert f.trend == pytest.approx(0.01, rel=0.1)
    assert f.at(60) == pytest.approx(f.level + 0.6, rel=0.05)


def test_a_jump_raises_the_upper_forecast_at_once_and_it_decays_after():
    before = feed([2.0] * 50)
    jumped = update(before, 12.0, 50 * 5.0)
    assert jumped.level < 6.0                           # the mean moves a third of the way...
    assert jumped.high(0.0) > jumped.level + 2.5        # ... and the surprise as much again on top
    later = feed([2.0] * 50 + [12.0] * 60)
    assert later.level == pytest.approx(12.0, rel=0.02) and later.spread < jumped.spread


def test_state_round_trips_through_a_dict():
    state = PredictiveState(feed([1.0, 3.0, 2.0]), 17.0, -1, (5.0,), ReturnGap((40.0, 45.0), 9, 310.0, 3))
    assert PredictiveState.from_dict(state.to_dict()) == state
    assert PredictiveState.from_dict(None) == PredictiveState()


SIZING = PerReplicaSizing(2.0)   # 2 req/s a replica


def test_per_replica_sizing():
    assert [SIZING.replicas_for(r) for r in (0.0, 2.0, 2.1, 9.0)] == [1, 1, 2, 5]
    assert SIZING.capacity(3) == 6.0 and SIZING.replicas_for(SIZING.capacity(7)) == 7


CONFIG = PredictiveConfig(min_replicas=1, max_replicas=20, confirm_down_s=30.0)


def run(rates, current=1, queue=0.0, state=PredictiveState(), step=5.0, cold_start=60.0, config=CONFIG):
    decisions = []
    for i, rate in enumerate(rates):
        d = decide(rate, queue, current, state, config, cold_start, i * step, SIZING)
        state, current = d.state, d.desired_replicas
        decisions.append(d)
    return decisions


def test_scales_up_for_the_forecast_and_the_queue():
    assert run([1.0] * 20)[-1].desired_replicas == 1
    assert run([1.0] * 20 + [9.0])[-1].desired_replicas > 1                   # at the first sign
    assert run([1.0] * 20 + [9.0] * 4)[-1].desired_replicas >= 5              # the whole need within 20 s
    queued = decide(1.0, 600.0, 1, run([1.0] * 20)[-1].state, CONFIG, 60.0, 100.0, SIZING)
    assert queued.desired_replicas >= 1 + 600 / 60 / 2 - 1   # the queue drains within one cold start


def test_scales_down_one_step_after_the_need_stays_low_and_never_without_metrics():
    decisions = run([9.0] * 40 + [1.0] * 80, current=5)
    counts = [d.desired_replicas for d in decisions]
    assert max(counts) == 5 and counts[-1] == 1
    assert all(a - b <= 1 for a, b in zip(counts, counts[1:]))        # one step at a time
    first_down = next(i + 1 for i, (a, b) in enumerate(zip(counts, counts[1:])) if b < a)   # its decision
    assert first_down * 5.0 >= 40 * 5.0 + CONFIG.confirm_down_s       # not before the confirmation
    held = decide(None, None, 5, decisions[50].state, CONFIG, 60.0, 1e6, SIZING)
    assert held.desired_replicas == 5 and "no metrics" in held.reason


def test_past_the_flap_budget_a_release_waits_a_re_orders_cost_but_the_fleet_is_never_locked_at_its_peak():
    """Past `max_flaps_per_hour` a release waits until the need has been below the fleet for as long as a re-order
    costs; the fleet is not held at its peak for the rest of the hour (on the public Azure code trace that held 20
    replicas for 40 minutes), and a scale-up is never held back."""
    config = PredictiveConfig(min_replicas=1, max_replicas=20, confirm_down_s=0.0, max_flaps_per_hour=2,
                              reorder_cost_cold_starts=0.5,   # 30 s at a 60 s cold start
                              forecast=ForecastConfig(level_half_life_s=1.0, spread_half_life_s=1.0))
    cycle = [9.0] * 6 + [1.0] * 12   # 30 s of need, 60 s without: longer than a re-order costs
    decisions = run(cycle * 6, config=config)
    counts = [d.desired_replicas for d in decisions]
    guarded = [i for i, d in enumerate(decisions) if "direction changes this hour" in d.reason]
    assert guarded and guarded[0] < len(cycle) * 2, guarded
    ups = [i for i in range(1, len(counts)) if counts[i] > counts[i - 1]]
    downs = [i for i in range(1, len(counts)) if counts[i] < counts[i - 1]]
    for i in downs:
        if i > guarded[0]:   # 6 passes of 5 s since the last order: the need was below for 30 s at least
            assert i - max(u for u in ups if u < i) >= 6 + 1, (i, counts)
    assert all(counts[c * len(cycle) - 1] == 1 for c in range(1, 7)), counts   # released in every cycle
    held = decisions[guarded[-1]]
    up = decide(30.0, 0.0, held.desired_replicas, held.state, config, 60.0, (guarded[-1] + 1) * 5.0, SIZING)
    assert up.desired_replicas > held.desired_replicas   # a scale-up is never held back


def test_where_the_need_comes_back_sooner_than_a_re_order_costs_a_fall_is_held_that_long():
    """Bursts shorter than a cold start with short silences between (the public Azure code trace): releasing in
    each silence re-orders the same replicas a minute later, so the fleet is held through a fall for as long as a
    re-order costs, and released a step per that long once a fall lasts longer."""
    config = replace(CONFIG, reorder_cost_cold_starts=2.0)   # 120 s at a 60 s cold start
    decisions = run(([9.0] * 4 + [1.0] * 12) * 4 + [1.0] * 80, current=5, config=config)
    counts = [d.desired_replicas for d in decisions]
    gradual = [i for i, d in enumerate(decisions) if "sooner than a re-order costs" in d.reason]
    assert gradual, counts
    first = gradual[0]   # the first release of the last fall, held as long as a re-order costs ...
    assert "for 120 s" in decisions[first].reason, decisions[first].reason
    downs = [i for i in range(1, len(counts)) if counts[i] < counts[i - 1] and i >= first]
    assert downs[0] == first and all(b - a == 30 / 5.0 for a, b in zip(downs, downs[1:])), (downs, counts)
    # ... then a step per confirmation (30 s)
    assert counts[-1] == 1   # released in the end


def test_a_significant_rise_sets_the_level_at_once_where_a_plain_observation_is_smoothed():
    settled = run([1.0] * 20)[-1].state
    smoothed = decide(9.0, 0.0, 1, settled, CONFIG, 60.0, 100.0, SIZING)
    risen = decide(9.0, 0.0, 1, settled, CONFIG, 60.0, 100.0, SIZING, rise=True)
    assert smoothed.state.forecast.level < 4.0 and risen.state.forecast.level == 9.0
    assert risen.desired_replicas > smoothed.desired_replicas and risen.desired_replicas >= 5   # 9 at 2 a replica
    lower = decide(0.5, 0.0, 1, settled, CONFIG, 60.0, 100.0, SIZING, rise=True)   # never lowers the level
    assert lower.state.forecast.level == decide(0.5, 0.0, 1, settled, CONFIG, 60.0, 100.0, SIZING).state.forecast.level


def test_a_rise_is_ordered_ahead_by_its_climb_but_the_forecaster_never_keeps_the_lead():
    settled = run([1.0] * 20)[-1].state                          # level 1 at 95 s
    no_lead = replace(CONFIG, rise_lead_s=0.0)
    plain = decide(9.0, 0.0, 1, settled, no_lead, 60.0, 100.0, SIZING, rise=True)
    led = decide(9.0, 0.0, 1, settled, CONFIG, 60.0, 100.0, SIZING, rise=True)
    assert led.state == plain.state                               # the lead is in the order only
    assert led.desired_replicas == plain.desired_replicas + 4     # 8 req/s of climb in 5 s, at 2 a replica
    assert "8.00 req/s more" in led.reason
    half = decide(9.0, 0.0, 1, settled, replace(CONFIG, rise_lead_s=2.5), 60.0, 100.0, SIZING, rise=True)
    assert half.desired_replicas == plain.desired_replicas + 2   # 2.5 s of a climb of 1.6 req/s a second
    flat = decide(9.0, 0.0, led.desired_replicas, led.state, CONFIG, 60.0, 105.0, SIZING, rise=True)
    assert "more" not in flat.reason and flat.desired_replicas == led.desired_replicas   # no climb: no lead, held
    unrisen = decide(9.0, 0.0, 1, settled, CONFIG, 60.0, 100.0, SIZING)
    assert "more" not in unrisen.reason                           # only a significant rise leads


def test_a_return_gap_is_learned_from_a_fall_to_the_need_coming_back_two_replicas():
    gaps = ReturnGap()
    gaps = gaps.observe(0.0, 10, 10, 10)
    assert not gaps.fell_below                                   # no fall while the need holds the fleet
    gaps = gaps.observe(10.0, 10, 2, 2).observe(100.0, 10, 2, 2)
    assert (gaps.fell_below, gaps.level, gaps.bottom) == ((10.0,) * 8, 10, 2)
    assert gaps.observe(200.0, 10, 3, 3).fell_below              # one replica back: not yet
    back = gaps.observe(210.0, 10, 4, 4)                         # two back
    assert not back.fell_below and back.gap_s == 200.0 and back.returns == 1
    again = back.observe(300.0, 10, 3, 3).observe(400.0, 4, 9, 9)
    assert again.gap_s == pytest.approx((200.0 + 100.0) / 2) and again.returns == 2
    dip = ReturnGap().observe(0.0, 5, 4, 4).observe(5.0, 5, 5, 5)    # one replica, back: not a fall
    assert not dip.fell_below and dip.gap_s is None
    two = ReturnGap().observe(0.0, 5, 3, 3).observe(50.0, 5, 4, 4)   # a fall of two, one back
    assert two.gap_s == 50.0
    open_fall = back.observe(300.0, 10, 3, 3)
    assert ReturnGap.from_dict(open_fall.to_dict()) == open_fall and ReturnGap.from_dict(again.to_dict()) == again


def test_a_return_gap_is_timed_from_when_the_need_fell_below_the_count_it_came_back_to():
    # A dip of one replica at a burst's peak opens the fall; the burst ends 200 s later; a smaller burst
    # comes 400 s after that.
    gaps = ReturnGap().observe(0.0, 10, 9, 9).observe(200.0, 10, 6, 6).observe(210.0, 10, 2, 2)
    assert gaps.fell_below == (0.0, 200.0, 200.0, 200.0, 210.0, 210.0, 210.0, 210.0)
    back = gaps.observe(610.0, 10, 5, 5)                         # back to 5: it fell below 5 at 210 s
    assert back.gap_s == 400.0                                   # not 610 s, from the dip at the peak
    assert gaps.observe(610.0, 10, 7, 7).gap_s == 410.0          # back to 7: below 7 since 200 s


def test_a_return_within_the_confirmation_is_no_return():
    # On a burst's rise the need swings as the pending fleet takes the backlog: 8, 6, 7 within 10 s.
    swing = ReturnGap().observe(610.0, 9, 6, 6).observe(615.0, 9, 8, 8, min_fall_s=30.0)
    assert not swing.fell_below and swing.gap_s is None and swing.returns == 0
    late = ReturnGap().observe(610.0, 9, 6, 6).observe(650.0, 9, 8, 8, min_fall_s=30.0)
    assert late.gap_s == 40.0


def test_return_gap_state_kept_by_an_older_operator_is_read():
    old = {"fellAt": 40.0, "level": 9, "bottom": 2, "gapSeconds": 310.0, "returns": 3}
    assert ReturnGap.from_dict(old) == ReturnGap((40.0,) * 7, 9, 310.0, 3)
    closed = {"fellAt": None, "level": 0, "bottom": 0, "gapSeconds": 310.0, "returns": 3}
    assert ReturnGap.from_dict(closed) == ReturnGap(gap_s=310.0, returns=3)


def test_a_need_comes_back_within_a_re_order_only_once_it_has_come_back_that_soon():
    assert not ReturnGap().comes_back_within(480.0)              # nothing learned yet
    assert ReturnGap(gap_s=200.0).comes_back_within(480.0)
    assert not ReturnGap(gap_s=600.0).comes_back_within(480.0)


def test_a_fleet_whose_need_came_back_sooner_than_a_re_order_is_released_slowly_and_others_promptly():
    burst, calm = [9.0] * 30, [1.0] * 40                   # 150 s of 9 req/s, then 200 s of 1 req/s
    decisions = run(burst + calm + burst + [1.0] * 130, current=5, cold_start=60.0)   # a re-order: 8 x 60 s
    counts = [d.desired_replicas for d in decisions]
    assert all(a - b <= 1 for a, b in zip(counts, counts[1:]))   # one step a decision
    first_calm, second_calm = counts[30:70], counts[100:140]
    assert max(first_calm) >= 5 and max(second_calm) >= 5
    assert decisions[100].state.return_gap.returns == 1   # the need came back 200 s after its fall
    prompt, slow = sum(c > 1 for c in first_calm), sum(c > 1 for c in second_calm)
    assert prompt <= (30 + 4 * 5 + 60) / 5                # a step a pass after the confirmation
    assert slow == len(second_calm)                       # held through a gap as long as the last one
    held = next(i for i in range(101, len(counts)) if counts[i] < counts[i - 1])
    assert held > 140 and "for 480 s" in decisions[held].reason and "came back" in decisions[held].reason, \
        decisions[held].reason   # the need below the fleet for as long as a re-order costs
    steps = [i for i in range(held, len(counts)) if counts[i] < counts[i - 1]]
    assert len(steps) >= 2 and all(b - a == 30 / 5.0 for a, b in zip(steps, steps[1:]))   # then a step per 30 s
    short = PredictiveConfig(min_replicas=1, max_replicas=20, confirm_down_s=30.0, reorder_cost_cold_starts=2.0)
    released = [d.desired_replicas for d in run(burst + calm + burst + calm, current=5, config=short)]
    assert sum(c > 1 for c in released[100:140]) <= prompt + 4 < slow   # a re-order (120 s) costs less than 200 s idle
