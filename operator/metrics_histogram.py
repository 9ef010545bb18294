"""Moved to kubeinfer.operator.autoscaling.metrics_histogram; this name stays until benchmarks/autoscale/sim.py and
benchmarks/serve.py import that."""

from kubeinfer.operator.autoscaling.metrics_histogram import *  # noqa: F401,F403
