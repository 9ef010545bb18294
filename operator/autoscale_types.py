"""Moved to kubeinfer.operator.autoscaling.policy_types; this name stays until benchmarks/autoscale_sim.py,
benchmarks/autoscale/sim.py, benchmarks/autoscale/policies.py and benchmarks/burst_real_vs_sim.py import that."""

from kubeinfer.operator.autoscaling.policy_types import *  # noqa: F401,F403
