"""The predictive policy's fast arrival signal (`recent_arrivals`): the last seconds' arrivals, used only when they
are a significant rise over the metric window's rate. Poisson streams are drawn with fixed seeds and read as the
operator reads them: the window's first tokens over 60 s, the recent ones over the span of a [15s] rate."""

from __future__ import annotations

import random
from bisect import bisect_right

import pytest

from kubeinfer.operator.autoscaling.policies.observations import arrival_rate, observe_queue
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals
from kubeinfer.operator.autoscaling.policies.recent_arrivals import (
    RECENT_COUNT_SPAN_S, Z_SIGNIFICANT, arrival_estimate, recent_arrival_rate, significantly_above,
)

WINDOW_S, TICK_S = 60.0, 5.0


def poisson_arrivals(rate_at, until: float, seed: int, peak: float) -> list[float]:
    """Arrival times of a Poisson process of rate `rate_at(t)` (thinning at `peak`)."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(peak)
        if t >= until:
            return out
        if rng.random() < rate_at(t) / peak:
            out.append(t)


def count(arrivals: list[float], start: float, end: float) -> int:
    return bisect_right(arrivals, end) - bisect_right(arrivals, start)


def rises(arrivals: list[float], ticks) -> list[bool]:
    """At each tick: whether the recent rate is a significant rise over the window's (no queue: all served)."""
    out = []
    for now in ticks:
        slow = count(arrivals, now - WINDOW_S, now) / WINDOW_S
        recent = count(arrivals, now - RECENT_COUNT_SPAN_S, now) / RECENT_COUNT_SPAN_S
        out.append(significantly_above(recent, slow))
    return out


@pytest.mark.parametrize("rate", [0.5, 2.0, 6.0, 20.0])
def test_a_steady_poisson_stream_rarely_reads_as_a_rise(rate):
    ticks = [WINDOW_S + TICK_S * i for i in range(2000)]   # 10,000 s of ticks
    arrivals = poisson_arrivals(lambda t: rate, ticks[-1] + 1, seed=7, peak=rate)
    share = sum(rises(arrivals, ticks)) / len(ticks)
    assert share < 0.01, f"{100 * share:.2f}% of the ticks of a steady {rate} req/s stream read as a rise"


@pytest.mark.parametrize("rate", [2.0, 6.0, 20.0])
def test_a_threefold_step_reads_as_a_rise_within_two_ticks(rate):
    """From 2 req/s up (at 1 req/s a 10 s count of a threefold step, ~30, is within 3 sd of the window's
    expectation, ~24, one time in six: seen later, or by the window)."""
    step_at, late = 600.0, 0
    for seed in range(20):
        arrivals = poisson_arrivals(lambda t: rate if t < step_at else 3 * rate, step_at + 30, seed, 3 * rate)
        if not any(rises(arrivals, [step_at + TICK_S, step_at + 2 * TICK_S])):
            late += 1
    assert late <= 1, f"{late} of 20 steps from {rate} to {3 * rate} req/s not seen within two ticks"


def test_the_rule_is_z_standard_deviations_of_the_slow_rates_count():
    expected = 4.0 * RECENT_COUNT_SPAN_S
    edge = (expected + Z_SIGNIFICANT * expected ** 0.5) / RECENT_COUNT_SPAN_S
    assert not significantly_above(edge - 0.01, 4.0) and significantly_above(edge + 0.01, 4.0)
    assert not significantly_above(0.0, 4.0)                      # a fall is never the recent signal's
    assert not significantly_above(0.3, 0.0) and significantly_above(0.5, 0.0)   # from idle: four arrivals


def history(*queue: tuple[float, float]) -> ScaleHistory:
    return ScaleHistory(queue_samples=tuple((t, q, 0.0, 2) for t, q in queue))


def test_the_recent_rate_is_first_tokens_plus_the_queues_last_change_while_it_does_not_fall():
    hist = history((900.0, 0.0), (985.0, 4.0), (990.0, 10.0), (995.0, 16.0), (1000.0, 24.0))
    signals = Signals(1000.0, queue_depth=24.0, request_rate=2.0, recent_request_rate=5.0)
    assert recent_arrival_rate(hist, signals) == pytest.approx(5.0 + (24.0 - 16.0) / 5.0)   # a ramp: the newest
    short = history((995.0, 16.0), (1000.0, 24.0))
    assert recent_arrival_rate(short, signals) == pytest.approx(5.0 + (24.0 - 16.0) / 5.0)
    assert recent_arrival_rate(history((1000.0, 24.0)), signals) == 5.0   # one sample: no change known
    assert recent_arrival_rate(hist, Signals(1000.0, queue_depth=24.0, request_rate=2.0)) is None


def test_where_the_queue_fell_within_the_counts_span_its_change_is_over_that_span():
    signals = Signals(1000.0, queue_depth=10.0, request_rate=2.0, recent_request_rate=15.0)
    drained_then_rose = history((900.0, 0.0), (990.0, 100.0), (995.0, 0.0), (1000.0, 10.0))
    assert recent_arrival_rate(drained_then_rose, signals) == pytest.approx(15.0 + (10.0 - 100.0) / 10.0)
    jittered = history((900.0, 0.0), (989.2, 100.0), (994.6, 0.0), (1000.0, 10.0))   # scrape times are not exact
    assert recent_arrival_rate(jittered, signals) == pytest.approx(15.0 + (10.0 - 100.0) / 10.8)
    fell_before = history((980.0, 100.0), (985.0, 0.0), (990.0, 0.0), (995.0, 0.0), (1000.0, 10.0))
    assert recent_arrival_rate(fell_before, signals) == pytest.approx(15.0 + 10.0 / 5.0)   # not within the span
    draining = history((990.0, 200.0), (995.0, 100.0), (1000.0, 0.0))
    assert recent_arrival_rate(draining, signals) == 0.0   # a queue drained faster than first tokens: none


def test_a_backlog_drained_at_steady_arrivals_is_no_rise():
    """4 req/s throughout; from 900 s the fleet serves 2 req/s, and at 1000 s fresh replicas drain the ~200
    waiting requests at 30 req/s within ~8 s. Their first tokens fill the 10 s count; only the queue's change over
    the same 10 s cancels them (over the last tick only: 11.0 and 10.1 req/s, rises, at 1010 and 1015 s)."""
    arrivals = poisson_arrivals(lambda t: 4.0, 1100.0, seed=3, peak=4.0)
    capacity = lambda t: 2.0 if 900.0 <= t < 1000.0 else 30.0   # requests the fleet starts per second
    waiting, served_at, hist, reads = 0.0, [], ScaleHistory(), {}
    config = PolicyConfig(max_replicas=10, metric_window_seconds=int(WINDOW_S))
    for second in range(1, 1100):
        waiting += count(arrivals, second - 1, second)
        served = min(waiting, capacity(second - 1))
        waiting -= served
        served_at.append((second, served))
        if second % TICK_S == 0 and second >= 120:
            def first_tokens(span):
                return sum(n for t, n in served_at if t > second - span)
            signals = Signals(float(second), queue_depth=waiting, request_rate=first_tokens(WINDOW_S) / WINDOW_S,
                              recent_request_rate=first_tokens(RECENT_COUNT_SPAN_S) / RECENT_COUNT_SPAN_S)
            hist = observe_queue(hist, signals, ReplicaCounts(current=2, ready=2), config)
            if second >= 1000:
                reads[second] = arrival_estimate(hist, signals, arrival_rate(hist, signals))
    assert not [t for t, (_, recent) in reads.items() if recent], reads
    assert all(3.0 < rate < 5.0 for rate, _ in reads.values())   # the window's: the 4 req/s that kept arriving


def test_the_estimate_is_the_recent_rate_on_a_rise_and_the_windows_otherwise():
    hist = history((990.0, 0.0), (995.0, 0.0), (1000.0, 0.0))
    rise = Signals(1000.0, queue_depth=0.0, request_rate=2.0, recent_request_rate=6.0)
    assert arrival_estimate(hist, rise, 2.0) == (6.0, True)
    noise = Signals(1000.0, queue_depth=0.0, request_rate=2.0, recent_request_rate=2.8)
    assert arrival_estimate(hist, noise, 2.0) == (2.0, False)
    fall = Signals(1000.0, queue_depth=0.0, request_rate=2.0, recent_request_rate=0.0)
    assert arrival_estimate(hist, fall, 2.0) == (2.0, False)
    missing = Signals(1000.0, queue_depth=0.0, request_rate=2.0)
    assert arrival_estimate(hist, missing, 2.0) == (2.0, False)
