"""Room 3, install: everything a cluster needs before the first InferenceService, generated from Python.

Owns: the CRDs (from the spec models), the generated parts of the Helm chart (Chart.yaml, the values schema,
the operator's RBAC rules, alerts, the Grafana dashboard, the kube-state-metrics config), and the install
as plain YAML (`kubeinfer manifests`, which renders the chart). Its commands keep their short names:
`python -m kubeinfer.operator.crd`, `.chart`, `.manifests` and `.rbac` are thin modules beside this room.

May import: the spec and the shared modules. Never the reconcile or the autoscaling room, nor the kopf handlers:
the install describes the operator, it does not run it.
"""
