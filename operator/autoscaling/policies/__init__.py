"""Autoscaling's policies: how many replicas now, from the signals and the history kept. Pure functions.

Owns: `types` (PolicyConfig, ScaleHistory, ScaleDecision), the reactive policy (`reactive.decide`, what it learns from
each observation in `observations`, its overload rule `drain_sizing`, its `pending_guard`), and the predictive one
(`predictive.decide`, its `forecast`, `return_gap` and `recent_arrivals`, and `predictive_pass`: how the operator's
pass runs it after the reactive one).

May import: the signals and sizing sub-rooms, the shared modules. Not the simulator or the pass.
"""
