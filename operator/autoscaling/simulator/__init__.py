"""Autoscaling's simulator: the policies of this room run on a discrete-event model of a fleet, against the limits.

Owns: `sim` (the fleet, its router and replicas, one trace replayed), `scenarios` (synthetic traces and the figures
per run), `trace_file` (public CSV traces), `policies` (the operator's policies wrapped, the peers' styles, a fixed
fleet), `clairvoyant` and `causal` (the limits read off the trace), `frontier` (the fewest GPU-hours per SLO share),
`roster` (the policies one sweep compares and the goals they are held to), `observation` and `replica_metrics` (the
signals a policy would read, computed as Prometheus would), and `multi_model` (a pool of models against a GPU each).
The scripts that print tables stay in benchmarks/ (autoscale_sim.py, autoscale_sweep.py, model_pool_trace.py).

May import: the signals, sizing and policies sub-rooms, the shared modules. Never the pass, never the runtime.
"""
