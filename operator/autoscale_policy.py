"""Moved to kubeinfer.operator.autoscaling.policy; this name stays until benchmarks/autoscale/policies.py import
that."""

from kubeinfer.operator.autoscaling.policy import *  # noqa: F401,F403
