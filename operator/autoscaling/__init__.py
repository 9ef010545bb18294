"""Room 2, autoscaling: spec.replicas of each autoscaled InferenceService, decided from its metrics.

Owns: at its top, the pass over one service (`autoscaler`: the kopf daemon's loop and its I/O; `plan.plan_pass`: the
pure decision and every write it implies; `pool_pass`: the two pools of spec.disaggregation; `history_status`: what
of the policies' history status keeps), which reads through four sub-rooms:

- `signals`: what is read: the metrics sources (Prometheus' HTTP API, or the pods' /metrics scraped directly), the
  PromQL-exact histogram arithmetic, the pods (Ready, replica counts, cold start), `Signals` and `ReplicaCounts`;
- `sizing`: what a replica does and what a fleet needs: the replica model, its calibration from the service's own
  metrics, the fleet that serves a rate within the TTFT target;
- `policies`: what to do: the reactive policy (`reactive.decide`) with its guards (drain sizing, pending guard), the
  predictive one with its forecaster and release, and their types (`PolicyConfig`, `ScaleHistory`, `ScaleDecision`);
- `simulator`: the discrete-event simulator that runs these policies against the clairvoyant limit, the frontier
  and the peers' styles on synthetic and replayed traces (benchmarks/autoscale_sim.py, autoscale_sweep.py).

May import: the spec, the shared modules (config, kube, events, times), and the reconcile room for the
names of what reconcile made (labels, ports, the replicas' and the router's pods) and its condition and
status-patch helpers. Never the install room, nor the kopf handlers; the reconcile room never imports this one.
Inside, the sub-rooms import one way: sizing <- signals <- policies <- simulator, and the pass at the top imports
them all (tests/operator/test_layout.py).
"""
