"""Moved to kubeinfer.operator.reconcile.pod; this name stays until benchmarks/pod_startup.py imports that."""

from kubeinfer.operator.reconcile.pod import *  # noqa: F401,F403
