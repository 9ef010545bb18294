"""Moved to kubeinfer.operator.autoscaling.predictive; this name stays until benchmarks/autoscale_sim.py and
benchmarks/autoscale/policies.py import that."""

from kubeinfer.operator.autoscaling.predictive import *  # noqa: F401,F403
