"""The InferenceService operator: one spec, three rooms, one process that runs two of them (docs/operator.md).

    spec/          the InferenceService API (typed spec and status, CEL rules); used by every room
    reconcile/     room 1: the children (Deployments, Services, PDB, ServiceMonitor, router, InferencePool)
                   built from the spec, applied, and the status written once per pass
    autoscaling/   room 2: metrics -> policy -> spec.replicas (which reconcile then applies)
    install/       room 3: CRDs, the chart's generated parts and the plain-YAML install, from the spec
    config, kube, events, times, metric_names
                   shared by the rooms: settings, the API client, Events, RFC 3339 times, metric names
    handlers       every kopf handler, registered once; imported by __main__ only
    __main__, preflight, peering
                   `kubeinfer operator`: checks the cluster, chooses peering, runs kopf
    crd, chart, manifests, rbac
                   the install's commands under their short names (`python -m kubeinfer.operator.crd`)

Imports run one way: spec <- shared <- reconcile <- autoscaling <- handlers, and spec <- shared <- install;
tests/operator/test_layout.py checks it.
"""
