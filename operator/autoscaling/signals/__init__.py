"""Autoscaling's signals: what the autoscaler reads of one InferenceService.

Owns: `measured` (`Signals`, `ReplicaCounts`: what a decision is made from), the metrics sources
(`metrics_source.PrometheusSource`, `prometheus_fleet.FleetSignals`: the whole fleet's rows from one round of
queries, `scrape_source.ScrapeSource`: the pods' /metrics), `metrics_histogram` (PromQL-exact), `readers` (the
clients every daemon shares), `pods` (live, Ready, counts, scrape targets), `cold_start` (creation -> Ready, learned),
and `pool_signals` (each pool of spec.disaggregation read apart).

May import: the sizing sub-room (the calibration's usage read from the metrics), the spec, the shared modules and
the reconcile room's names (ports). Not the policies, the simulator or the pass.
"""
