"""Room 1, reconcile: an InferenceService's children made to match its spec, and its status written once.

Owns: the pure builders of the children (the replicas' Deployment, pod template, Service, PDB,
ServiceMonitor; the router's Deployment and Service; the InferencePool), the one apply step that writes
them, the checks the CRD schema cannot express, the status computation, and the reconcile pass that
strings them together.

May import: the spec and the shared modules (config, kube, events, times). Never the autoscaling or the
install room, nor the kopf handlers.
"""
