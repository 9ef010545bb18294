"""The pure parts of autoscaling spec.disaggregation's pools: each pool's signals from what its pods said, the decode
pool's own pressure in the policy, the binding of both pools' decisions (zero and wake together), and one pass's
plan with its writes. The running operator doing it: test_disaggregation_autoscaler_kmock.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubeinfer.operator.autoscaling.policies.reactive import decide
from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals
from kubeinfer.operator.autoscaling.pool_pass import plan_pools, together
from kubeinfer.operator.autoscaling.signals.pool_signals import DecodeExtras, combine
from kubeinfer.operator.reconcile import pools
from kubeinfer.operator.spec import parse_spec

NOW = 1_800_000_000.0


@pytest.mark.parametrize("decided, bound", [
    ({"prefill": 0, "decode": 0}, {"prefill": 0, "decode": 0}),   # both idle: both to zero
    ({"prefill": 0, "decode": 2}, {"prefill": 1, "decode": 2}),   # prefill idle alone: it stays up
    ({"prefill": 3, "decode": 0}, {"prefill": 3, "decode": 1}),   # prefill wakes: decode wakes with it
    ({"prefill": 2, "decode": 3}, {"prefill": 2, "decode": 3}),
])
def test_pools_reach_zero_together_and_leave_it_together(decided: dict[str, int], bound: dict[str, int]) -> None:
    assert together(decided) == bound


def test_each_pool_gets_its_own_signals_and_the_router_queue_counts_in_both() -> None:
    prefill = Signals(timestamp=NOW, queue_depth=5, num_running=2, ttft_p95_seconds=None, request_rate=0.0)
    decode = Signals(timestamp=NOW, queue_depth=1, num_running=7, ttft_p95_seconds=0.8, request_rate=3.0,
                     recent_request_rate=4.0)
    out = combine({"prefill": prefill, "decode": decode}, DecodeExtras(0.04, 0.9), router_waiting=2.0,
                  num_pods={"prefill": 1, "decode": 2})
    # Prefill: its own queue (plus the router's), the service's TTFT and arrivals, measured on the decode pool.
    assert (out["prefill"].queue_depth, out["prefill"].num_running) == (7.0, 2)
    assert (out["prefill"].ttft_p95_seconds, out["prefill"].request_rate, out["prefill"].recent_request_rate) == \
        (0.8, 3.0, 4.0)
    assert out["prefill"].kv_cache_usage is None and out["prefill"].itl_p95_seconds is None
    # Decode: its own queue (plus the router's), running, KV use and ITL; TTFT is the prefill pool's to answer.
    assert (out["decode"].queue_depth, out["decode"].num_running, out["decode"].ttft_p95_seconds) == (3.0, 7, None)
    assert (out["decode"].kv_cache_usage, out["decode"].itl_p95_seconds) == (0.9, 0.04)


def test_a_pool_scaled_to_zero_is_woken_by_the_routers_queue() -> None:
    missing = Signals.missing("no pods to scrape", NOW)
    out = combine({"prefill": missing, "decode": missing}, DecodeExtras(None, None), router_waiting=1.0,
                  num_pods={"prefill": 0, "decode": 0})
    assert out["prefill"].queue_depth == out["decode"].queue_depth == 1.0


def _decode_config(**targets: Any) -> PolicyConfig:
    return PolicyConfig(max_replicas=8, min_replicas=1, target_queue_depth_per_replica=4, initial_delay_seconds=0,
                        **targets)


@pytest.mark.parametrize("kv, itl, targets, desired, words", [
    (0.95, None, {"target_kv_cache_usage": 0.8}, 3, "KV cache 95% in use (target 80%)"),     # 2 x 1.19 -> 3
    (0.5, 0.09, {"target_kv_cache_usage": 0.8, "target_itl_p95_seconds": 0.05}, 4, "ITL P95 0.090s"),  # 2 x 1.8
    (0.5, 0.09, {"target_kv_cache_usage": 0.8}, 2, ""),          # no ITL target: ITL is not a rule
    (0.95, 0.09, {}, 2, ""),                                     # a colocated fleet: neither is
])
def test_decode_pressure_grows_the_decode_pool(kv: float, itl: float | None, targets: dict[str, float],
                                               desired: int, words: str) -> None:
    signals = Signals(timestamp=NOW, queue_depth=0.0, num_running=8.0, request_rate=1.0, itl_p95_seconds=itl,
                      kv_cache_usage=kv)
    decision = decide(signals, ReplicaCounts(current=2, ready=2), ScaleHistory(), _decode_config(**targets), NOW)
    assert decision.desired_replicas == desired, decision
    assert words in decision.message


def _body(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": "default", "uid": "u", "generation": 1}, "spec": spec,
            "status": status or {}}


def _pod(role: str) -> dict[str, Any]:
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 3600))
    return {"metadata": {"name": f"q-{role}-0", "creationTimestamp": old, "labels": {pools.POOL_LABEL: role}},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}


def test_one_pass_plans_both_pools_and_writes_both_sizes_in_one_patch() -> None:
    scaling = {"minReplicas": 0, "maxReplicas": 4, "scaleToZeroIdleSeconds": 0, "initialDelaySeconds": 0}
    raw = {"model": {"uri": "pvc://m/q"}, "router": {},
           "disaggregation": {"prefill": {"replicas": 1, "autoscaling": scaling},
                              "decode": {"replicas": 1, "autoscaling": scaling}}}
    idle = Signals(timestamp=NOW, queue_depth=0.0, num_running=0.0, request_rate=0.0)
    busy = Signals(timestamp=NOW, queue_depth=0.0, num_running=1.0, request_rate=0.0)
    pods_ = [_pod("prefill"), _pod("decode")]
    held = plan_pools(_body(raw), parse_spec(raw), {"prefill": idle, "decode": busy}, pods_, NOW, {})
    assert held.plans["prefill"].decision.desired_replicas == 0 and held.desired == {"prefill": 1, "decode": 1}
    assert held.replicas_patch is None and held.status["disaggregation"]["prefill"]["desiredReplicas"] == 1
    assert {c["type"] for c in held.status["conditions"]} == {"ScalingActive", "MetricsAvailable"}
    both = plan_pools(_body(raw), parse_spec(raw), {"prefill": idle, "decode": idle}, pods_, NOW, {})
    assert both.replicas_patch == {"spec": {"disaggregation": {"prefill": {"replicas": 0},
                                                               "decode": {"replicas": 0}}}}
    assert sorted(e.message.split(":")[0] for e in both.events if e.reason == "ScaleToZero") == \
        ["decode pool", "prefill pool"]
