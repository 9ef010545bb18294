"""The predictive policy's fleet sizing from the replica model calibrated on the service's metrics. Pure.

`estimate` turns a `calibration.Calibration` into a replica model: the step costs, the request mix as 100
(prompt, output) pairs (quantiles of the two histograms, interpolated in their buckets as PromQL does, paired at
random with a fixed seed), and the attainable share: the requests an idle replica answers within the target, each
prompt counted at its bucket's upper bound (a point mass at a context limit, interpolated inside its bucket, would
count prompts as answerable that are not). `in_use` keeps the model in use until a fresh estimate differs by more
than 10% in a step cost or a mean length, or by two points in the attainable share, or stands on twice the
requests: each model in use is one sizing table (`fleet_sizing.ModelSizing`, cached), so it must not change with
every pass's noise, but the first model, made from the first 200 requests, is the noisiest, and a better one within
10% of it was never taken (bursty_conversation: prompts of 993 tokens on average in the model in use for the whole
trace, 1,040 in the calibration by its end; docs/benchmarks/autoscaling.md). `sizing` is the `Sizing`
the policy asks: the fleet a steady rate needs for 99% of first tokens within the TTFT target, or 2 points below the
attainable share where long prompts alone take longer.
"""

from __future__ import annotations

import random
from typing import Any

from kubeinfer.operator.autoscaling.sizing.calibration import MIN_REQUESTS, Calibration, quantiles, with_costs
from kubeinfer.operator.autoscaling.sizing.fleet_sizing import MARGIN, SHARE, ModelSizing, attainable_share
from kubeinfer.operator.autoscaling.sizing.replica_model import ReplicaModel

NUM_LENGTHS = 100
REFRESH = 0.10          # relative change of a step cost or a mean length that replaces the model in use
REFRESH_SHARE = 0.02    # change of the attainable share that does (two of the 100 lengths: one flips with noise)
COSTS = ("decodeBaseSeconds", "decodePerSequenceSeconds", "prefillSecondsPerToken")


def _sig(x: float) -> float:
    return float(f"{x:.3g}")


def estimate(calibration: Calibration, base: ReplicaModel, ttft_target_s: float) -> dict[str, Any] | None:
    """The replica model the calibration supports now (status form), or None before it has enough data."""
    costs = calibration.step_costs
    if costs is None or not calibration.has_mix:
        return None
    found = {**{name: _sig(c) for name, c in zip(COSTS, costs)},
             "prompts": quantiles(calibration.prompt_tokens, NUM_LENGTHS, at_upper_bound=False),
             "outputs": quantiles(calibration.generation_tokens, NUM_LENGTHS, at_upper_bound=False)}
    longest = [(p, 1) for p in quantiles(calibration.prompt_tokens, NUM_LENGTHS, at_upper_bound=True)]
    found["attainableShare"] = round(attainable_share(tuple(longest), ttft_target_s, replica_model(found, base)), 4)
    found["requests"] = round(calibration.requests, 1)
    return found


def replica_model(found: dict[str, Any], base: ReplicaModel) -> ReplicaModel:
    return with_costs(base, tuple(found[name] for name in COSTS))


def lengths(found: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    outputs = list(found["outputs"])
    random.Random(0).shuffle(outputs)
    return tuple(zip(found["prompts"], outputs))


def _changed(old: float, new: float) -> bool:
    return abs(new - old) > REFRESH * max(abs(old), abs(new), 1e-9)


def in_use(fresh: dict[str, Any] | None, kept: dict[str, Any] | None) -> dict[str, Any] | None:
    """The model to size with: the kept one unless the fresh estimate moved beyond the refresh thresholds."""
    if fresh is None or kept == fresh:
        return kept
    if kept is None or "attainableShare" not in kept:   # none yet, or one an older operator wrote
        return fresh
    if any(_changed(kept[name], fresh[name]) for name in COSTS):
        return fresh
    for key in ("prompts", "outputs"):
        if _changed(sum(kept[key]) / len(kept[key]), sum(fresh[key]) / len(fresh[key])):
            return fresh
    if fresh.get("requests", 0.0) >= 2 * kept.get("requests", MIN_REQUESTS):   # none kept: an older operator's
        return fresh
    return fresh if abs(kept["attainableShare"] - fresh["attainableShare"]) > REFRESH_SHARE else kept


def sizing(found: dict[str, Any], base: ReplicaModel, ttft_target_s: float, max_replicas: int,
           itl_target_s: float | None = None) -> ModelSizing | None:
    """The fleet sizing of a model in use; None when no share of requests is attainable within the target. An ITL
    target counts only where a step of one decoding sequence meets it (`itl_attainable`): below that no fleet does."""
    model = replica_model(found, base)
    pairs = lengths(found)
    share = round(min(SHARE, found["attainableShare"] - MARGIN), 4)
    if share <= 0:
        return None
    itl = itl_target_s if itl_target_s is not None and itl_attainable(model, itl_target_s) else None
    return ModelSizing(model, pairs, ttft_target_s, share, max_replicas, itl)


def itl_attainable(model: ReplicaModel, itl_target_s: float) -> bool:
    return model.step_seconds(1, 0) <= itl_target_s
