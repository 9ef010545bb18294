"""The replica model calibrated from the service's metrics (`autoscaling.calibration`, `calibrated_sizing`): the
step costs recovered from the step moments the runtime exports, the request mix from its length histograms."""

from __future__ import annotations

import json
import math
import random

import pytest

from kubeinfer.operator.autoscaling.sizing import calibrated_sizing
from kubeinfer.operator.autoscaling.sizing.calibration import (
    MIN_REQUESTS, MIN_STEPS, Calibration, ReplicaUsage, StepMoments, quantiles, usage_from,
)
from kubeinfer.operator.autoscaling.sizing.replica_model import ReplicaModel

BASE, PER_SEQ, PER_TOKEN = 0.021, 0.00075, 0.000118
INF = float("inf")


def moments(steps, costs=(BASE, PER_SEQ, PER_TOKEN), noise=0.0, seed=0) -> StepMoments:
    """The moments of `steps` (n, p) pairs timed by the linear step model, with relative noise."""
    rng = random.Random(seed)
    out = [0.0] * 9
    for n, p in steps:
        t = (costs[0] + costs[1] * n + costs[2] * p) * (1 + rng.uniform(-noise, noise))
        for k, v in enumerate((1, t, n, p, n * n, n * p, p * p, n * t, p * t)):
            out[k] += v
    return StepMoments(*out)


def mixed_steps(count: int, seed: int = 1) -> list[tuple[int, int]]:
    """Decode batches of 0-32 sequences, a third of them with a prefill of up to 4,096 tokens."""
    rng = random.Random(seed)
    return [(rng.randint(0, 32), rng.randint(16, 4096) if rng.random() < 0.33 else 0) for _ in range(count)]


def test_the_fit_recovers_known_step_costs_exactly_and_within_a_few_percent_under_5_percent_noise():
    exact = moments(mixed_steps(2000)).fit()
    assert exact == pytest.approx((BASE, PER_SEQ, PER_TOKEN), rel=1e-9)
    noisy = moments(mixed_steps(2000), noise=0.05).fit()
    assert noisy == pytest.approx((BASE, PER_SEQ, PER_TOKEN), rel=0.05)
    other = (0.003, 0.00015, 0.0002)   # the CPU demo model's costs
    assert moments(mixed_steps(2000), other).fit() == pytest.approx(other, rel=1e-9)


def test_steps_that_do_not_tell_the_costs_apart_give_no_fit():
    assert moments([(8, 0)] * 500).fit() is None              # no prefill at all
    assert moments([(8, 512)] * 500).fit() is None            # every step alike: base, n and p confounded
    assert moments([(n, 64 * n) for n in range(1, 33)] * 20).fit() is None   # p a multiple of n
    assert StepMoments().fit() is None


def usage(steps, prompts, outputs) -> ReplicaUsage:
    def cumulative(values, bounds):
        return tuple((b, float(sum(1 for v in values if v <= b))) for b in (*bounds, INF))
    return ReplicaUsage(moments(steps), cumulative(prompts, range(128, 4097, 128)),
                        cumulative(outputs, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)))


def test_a_calibration_is_ready_once_it_holds_enough_steps_and_requests_and_survives_the_status():
    rng = random.Random(3)
    prompts = [rng.randint(100, 3000) for _ in range(60)]
    outputs = [rng.randint(5, 300) for _ in range(60)]
    cal = Calibration()
    for k in range(12):   # 60 s windows read every 5 s: each adds 1/12 of its content
        cal = cal.observe(usage(mixed_steps(200, seed=k), prompts, outputs), 1000.0 + 5 * k, 60.0)
        cal = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))   # through the status
    assert cal.moments.steps < MIN_STEPS and cal.step_costs is None and not cal.has_mix
    for k in range(12, 400):
        cal = cal.observe(usage(mixed_steps(200, seed=k), prompts, outputs), 1000.0 + 5 * k, 60.0)
    assert cal.moments.steps >= MIN_STEPS and cal.has_mix
    assert cal.step_costs == pytest.approx((BASE, PER_SEQ, PER_TOKEN), rel=1e-6)
    total = cal.prompt_tokens[-1][1]
    assert total >= MIN_REQUESTS and math.isinf(cal.prompt_tokens[-1][0])
    # the same pass twice adds nothing; a missing usage keeps the calibration
    assert cal.observe(usage(mixed_steps(200), prompts, outputs), cal.updated_at, 60.0) == cal
    assert cal.observe(None, cal.updated_at + 5, 60.0) == cal


def test_a_calibration_says_what_it_still_waits_for():
    prompts, outputs = [500] * 300, [50] * 300
    assert Calibration().waiting_for() == "0 of 500 engine steps, 0 of 200 finished requests"
    few = Calibration().observe(usage(mixed_steps(120), prompts[:80], outputs[:80]), 0.0, 60.0)
    assert few.waiting_for() == "120 of 500 engine steps, 80 of 200 finished requests"
    ready = Calibration().observe(usage(mixed_steps(600), prompts, outputs), 0.0, 60.0)
    assert ready.waiting_for() is None and ready.step_costs is not None
    alike = Calibration().observe(usage([(8, 512)] * 600, prompts, outputs), 0.0, 60.0)
    assert "cannot tell the per-sequence cost from the per-token one" in alike.waiting_for()
    # steps that take no longer with more prefill tokens: no model can price a prompt, and that is said
    lengths = usage([], prompts, outputs)
    free_prefill = ReplicaUsage(moments(mixed_steps(600), (0.01, 0.001, -0.00001)), lengths.prompt_tokens,
                                lengths.generation_tokens)
    said = Calibration().observe(free_prefill, 0.0, 60.0).waiting_for()
    assert said.startswith("steps whose time grows with their prefill tokens (the fit reads 0.01 s a step"), said


def test_a_cost_that_fits_below_zero_is_fitted_at_zero_with_the_others_refitted():
    """A CPU replica of a tiny model: a step at 4 sequences takes no longer than at 1, and noise reads the
    per-sequence cost below zero. The fit keeps it at zero and refits the rest, as non-negative least squares
    (checked against an exhaustive search over the constrained costs); a fit already non-negative is unchanged."""
    steps = mixed_steps(1500, seed=5)
    m = moments(steps, (0.005, -0.00005, 0.00012), noise=0.02, seed=6)
    free = m.fit()
    assert free[1] < 0
    base, per_seq, per_token = m.fit(nonnegative=True)
    assert per_seq == 0.0 and base > 0 and per_token > 0

    def residual(c):   # the sum of squares up to the steps' own (constant) sum of t squared
        b0, b1, b2 = c
        return (b0 * b0 * m.steps + b1 * b1 * m.nn + b2 * b2 * m.pp + 2 * (b0 * b1 * m.n + b0 * b2 * m.p + b1 * b2 * m.np)
                - 2 * (b0 * m.t + b1 * m.nt + b2 * m.pt))
    best = residual((base, per_seq, per_token))
    for d0 in (-1e-4, 0, 1e-4):
        for d1 in (0, 1e-6, 1e-5):
            for d2 in (-1e-6, 0, 1e-6):
                assert residual((base + d0, per_seq + d1, per_token + d2)) >= best - 1e-12
    exact = moments(mixed_steps(2000))
    assert exact.fit(nonnegative=True) == pytest.approx(exact.fit(), rel=1e-12)
    assert Calibration(m).step_costs == (base, per_seq, per_token)   # what the sizing is made from


def test_the_old_half_decays_away_within_a_half_life():
    cal = Calibration().observe(ReplicaUsage(StepMoments(steps=1000.0)), 0.0, 60.0)
    cal = cal.observe(ReplicaUsage(StepMoments()), 60.0, 60.0, half_life_s=60.0)
    assert cal.moments.steps == pytest.approx(500.0)


def test_quantiles_at_the_bucket_bound_or_interpolated():
    buckets = ((128.0, 50.0), (256.0, 50.0), (384.0, 100.0), (INF, 100.0))
    assert quantiles(buckets, 4, at_upper_bound=True) == [128, 128, 384, 384]
    assert quantiles(buckets, 4, at_upper_bound=False) == [32, 96, 288, 352]
    assert quantiles(((16.0, 0.0), (INF, 10.0)), 2, at_upper_bound=False) == [16, 16]   # +Inf: the top bound


def test_usage_from_needs_the_step_series():
    assert usage_from(None, None, {}, {}, {}) is None
    u = usage_from(10.0, 0.5, {"n": 40.0, "pt": 2.0}, {INF: 3.0, 128.0: 1.0}, {INF: 3.0})
    assert (u.moments.steps, u.moments.t, u.moments.n, u.moments.pt, u.moments.pp) == (10, 0.5, 40, 2.0, 0)
    assert u.prompt_tokens == ((128.0, 1.0), (INF, 3.0))


def found(per_token=PER_TOKEN, prompts=(1000,) * 100, outputs=(50,) * 100, share=1.0, requests=200.0):
    return {"decodeBaseSeconds": BASE, "decodePerSequenceSeconds": PER_SEQ, "prefillSecondsPerToken": per_token,
            "prompts": list(prompts), "outputs": list(outputs), "attainableShare": share, "requests": requests}


def test_the_model_in_use_changes_only_past_the_refresh_thresholds():
    kept = found()
    assert calibrated_sizing.in_use(None, kept) is kept
    assert calibrated_sizing.in_use(found(), None) == found()
    assert calibrated_sizing.in_use(found(per_token=PER_TOKEN * 1.05), kept) is kept
    assert calibrated_sizing.in_use(found(per_token=PER_TOKEN * 1.2), kept)["prefillSecondsPerToken"] == PER_TOKEN * 1.2
    assert calibrated_sizing.in_use(found(outputs=(60,) * 100), kept) is not kept
    assert calibrated_sizing.in_use(found(share=0.99), kept) is kept       # one of the 100 lengths: noise
    assert calibrated_sizing.in_use(found(share=0.95), kept) is not kept   # 5% of prompts now too long


def test_the_model_in_use_is_replaced_by_one_on_twice_the_requests_even_within_the_thresholds():
    kept = found(prompts=(993,) * 100, requests=210.0)
    closer = found(prompts=(1040,) * 100, requests=419.0)           # 4.7% more prompt: within the 10%
    assert calibrated_sizing.in_use(closer, kept) is kept
    doubled = found(prompts=(1040,) * 100, requests=420.0)
    assert calibrated_sizing.in_use(doubled, kept) is doubled
    older = {k: v for k, v in kept.items() if k != "requests"}    # kept by an operator before the count: as if
    assert calibrated_sizing.in_use(found(prompts=(1040,) * 100, requests=399.0), older) is older   # made from 200
    assert calibrated_sizing.in_use(doubled, older) is doubled


def test_the_estimate_prices_the_load_by_interpolation_and_attainability_by_the_bucket_bound():
    """Prompts spread over 1,000-3,000 tokens, and 5% clipped at 4,096: 0.5 s allows 4,060 tokens at these costs,
    so the clipped ones (interpolated inside (3968, 4096] to below 4,060) are not attainable."""
    rng = random.Random(4)
    prompts = [rng.randint(1000, 3000) for _ in range(950)] + [4096] * 50
    steps = mixed_steps(2000)
    cal = Calibration().observe(usage(steps, prompts, [30] * 1000), 0.0, 60.0)
    cal = Calibration(cal.moments, tuple((le, c) for le, c in cal.prompt_tokens),
                      cal.generation_tokens, 0.0)
    est = calibrated_sizing.estimate(cal, ReplicaModel(), 0.5)
    assert est["prefillSecondsPerToken"] == pytest.approx(PER_TOKEN, rel=1e-2)
    assert est["attainableShare"] == pytest.approx(0.95)
    assert est["requests"] == 1000.0
    assert abs(sum(est["prompts"]) / 100 - sum(prompts) / 1000) < 40   # the mean load, not biased up
    assert sizing_share_of(est) == pytest.approx(0.93)


def sizing_share_of(est):
    return calibrated_sizing.sizing(est, ReplicaModel(), 0.5, 10).share


def test_the_sizing_sizes_for_the_attainable_share_and_none_when_nothing_is():
    sizing = calibrated_sizing.sizing(found(share=0.9), ReplicaModel(), 0.5, 10)
    assert sizing.share == pytest.approx(0.88)   # 90% attainable, less 2 points
    assert sizing.model.prefill_s_per_token == PER_TOKEN and sizing.model.decode_base_s == BASE
    assert calibrated_sizing.sizing(found(share=1.0), ReplicaModel(), 0.5, 10).share == 0.98
    assert calibrated_sizing.sizing(found(share=0.01), ReplicaModel(), 0.5, 10) is None
