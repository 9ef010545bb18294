"""Moved to kubeinfer.operator.autoscaling.cold_start; this name stays until benchmarks/autoscale/sim.py and
benchmarks/autoscale/policies.py import that."""

from kubeinfer.operator.autoscaling.cold_start import *  # noqa: F401,F403
