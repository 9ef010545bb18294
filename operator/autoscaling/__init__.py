"""Room 2, autoscaling: spec.replicas of each autoscaled InferenceService, decided from its metrics.

Owns: the metrics sources (Prometheus' HTTP API, or the pods' /metrics scraped directly) and the PromQL-exact
histogram arithmetic, the pure policies (`policy.decide`, and the predictive one with its forecaster) with
their types, the cold start learned from the service's pods, and the autoscaler's pass, which writes
spec.replicas, its status fields and Events.

May import: the spec, the shared modules (config, kube, events, times), and the reconcile room for the
names of what reconcile made (labels, ports, the replicas' and the router's pods) and its condition and
status-patch helpers. Never the install room, nor the kopf handlers; the reconcile room never imports this one.
"""
