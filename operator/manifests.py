"""The install as plain Kubernetes objects: ``kubeinfer manifests`` for users without Helm.

The objects here are what ``charts/kubeinfer/templates`` render with the same values (tests/charts renders
the templates with a small Helm-subset renderer and compares). Their large parts come from one place each:
CRDs from :mod:`kubeinfer.operator.crd`, ClusterRole rules from :mod:`kubeinfer.operator.rbac`, alerts,
dashboard and kube-state-metrics config from :mod:`kubeinfer.operator.monitoring`, values and their schema
from :mod:`kubeinfer.operator.chart_values`.

    kubeinfer manifests > kubeinfer.yaml                      # the operator, CRDs, RBAC
    kubeinfer manifests --set monitoring.prometheusRule.enabled=true -f my-values.yaml | kubectl apply -f -
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from kubeinfer import __version__
from kubeinfer.operator import crd, monitoring, rbac
from kubeinfer.operator.chart_values import parse_set, resolve

DEFAULT_RELEASE = "kubeinfer"
DEFAULT_NAMESPACE = "kubeinfer-system"
HEALTH_PORT = 8080
DASHBOARD_FILE = "kubeinfer-overview.json"
KSM_CONFIG_FILE = "kube-state-metrics-config.yaml"


def labels(release: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "kubeinfer", "app.kubernetes.io/instance": release,
            "app.kubernetes.io/component": component, "app.kubernetes.io/version": __version__}


def _meta(name: str, release: str, component: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {**labels(release, component), **extra.pop("extra_labels", {})}
    meta.update(extra)
    return meta


def operator_env(values: dict[str, Any]) -> list[dict[str, Any]]:
    env = [{"name": "KUBEINFER_NAMESPACES", "value": ",".join(values["watchNamespaces"])},
           {"name": "KUBEINFER_RUNTIME_IMAGE", "value": values["runtimeImage"]},
           {"name": "KUBEINFER_SERVICE_MONITOR", "value": values["serviceMonitorMode"]},
           {"name": "KUBEINFER_PROMETHEUS_URL", "value": values["prometheusUrl"]}]
    if values["peering"]["enabled"]:
        env.append({"name": "KUBEINFER_PEERING", "value": values["peering"]["name"]})
    else:
        env.append({"name": "KUBEINFER_STANDALONE", "value": "true"})
    # kopf names this copy in the peering object after its pod.
    env.append({"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return env


def operator_deployment(values: dict[str, Any], release: str, namespace: str) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": "kubeinfer", "app.kubernetes.io/instance": release,
                "app.kubernetes.io/component": "operator"}
    image = values["image"]
    args = ["--liveness", f"http://0.0.0.0:{HEALTH_PORT}/healthz"] + (["--verbose"] if values["logLevel"] == "debug" else [])
    pod_spec: dict[str, Any] = {
        "serviceAccountName": values["serviceAccount"]["name"],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "operator",
            "image": f"{image['repository']}:{image['tag']}",
            "imagePullPolicy": image["pullPolicy"],
            "command": ["kubeinfer", "operator"],
            "args": args,
            "env": operator_env(values),
            "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"},
                              "initialDelaySeconds": 10, "periodSeconds": 20, "timeoutSeconds": 5},
            "resources": values["resources"],
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity", "priorityClassName"):
        if values[key]:
            pod_spec[key] = values[key]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(f"{release}-operator", release, "operator", namespace),
        "spec": {
            "replicas": values["replicaCount"],
            # Never two copies at once during an upgrade (peering would hold one back anyway).
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels(release, "operator")}, "spec": pod_spec},
        },
    }


def operator_objects(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    account = values["serviceAccount"]
    if account["create"]:
        meta = _meta(account["name"], release, "operator", namespace)
        if account["annotations"]:
            meta["annotations"] = account["annotations"]
        objs.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    if values["rbac"]["create"]:
        role = f"{release}-operator"
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": _meta(role, release, "operator"), "rules": rbac.RULES})
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": _meta(role, release, "operator"),
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                     "subjects": [{"kind": "ServiceAccount", "name": account["name"], "namespace": namespace}]})
    if values["peering"]["enabled"]:
        name = values["peering"]["name"]
        if values["watchNamespaces"]:
            objs.extend({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                         "metadata": _meta(name, release, "operator", ns)} for ns in values["watchNamespaces"])
        else:
            objs.append({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                         "metadata": _meta(name, release, "operator")})
    objs.append(operator_deployment(values, release, namespace))
    return objs


def monitoring_objects(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    mon = values["monitoring"]
    objs: list[dict[str, Any]] = []
    if mon["podMonitor"]["enabled"]:
        objs.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(f"{release}-runtime", release, "monitoring", namespace,
                              extra_labels=mon["podMonitor"]["labels"]),
            "spec": {
                "namespaceSelector": {"any": True},
                "selector": {"matchExpressions": [{"key": "kubeinfer.dev/inferenceservice", "operator": "Exists"}]},
                "podMetricsEndpoints": [{
                    "port": "http", "path": "/metrics", "interval": mon["podMonitor"]["interval"],
                    # `service` = the InferenceService, as the operator's ServiceMonitors label it.
                    "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_label_kubeinfer_dev_inferenceservice"],
                                     "targetLabel": "service", "action": "replace"}],
                }],
            },
        })
    if mon["prometheusRule"]["enabled"]:
        objs.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(f"{release}-alerts", release, "monitoring", namespace,
                              extra_labels=mon["prometheusRule"]["labels"]),
            "spec": {"groups": monitoring.rule_groups(mon["alerts"], mon["runbookBaseUrl"])},
        })
    if mon["dashboard"]["enabled"]:
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": _meta(f"{release}-dashboard", release, "monitoring", namespace,
                                       extra_labels=mon["dashboard"]["labels"]),
                     "data": {DASHBOARD_FILE: dashboard_json().rstrip("\n")}})
    if mon["kubeStateMetrics"]["enabled"]:
        ksm = mon["kubeStateMetrics"]["serviceAccount"]
        role = f"{release}-kube-state-metrics"
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": _meta(role, release, "monitoring", namespace),
                     "data": {KSM_CONFIG_FILE: ksm_config_yaml().rstrip("\n")}})
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": _meta(role, release, "monitoring"),
                     "rules": [{"apiGroups": ["kubeinfer.dev"], "resources": ["inferenceservices"],
                                "verbs": ["list", "watch"]},
                               {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                                "verbs": ["list", "watch"]}]})
        objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": _meta(role, release, "monitoring"),
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                     "subjects": [{"kind": "ServiceAccount", **ksm}]})
    return objs


def dashboard_json() -> str:
    return json.dumps(monitoring.dashboard(), indent=2) + "\n"


def ksm_config_yaml() -> str:
    return yaml.safe_dump(monitoring.kube_state_metrics_config(), sort_keys=False, width=120)


def crd_objects() -> list[dict[str, Any]]:
    return [crd.inference_service_crd(), *crd.peering_crds()]


def render(values: dict[str, Any], release: str = DEFAULT_RELEASE, namespace: str = DEFAULT_NAMESPACE,
           create_namespace: bool = True) -> list[dict[str, Any]]:
    """Every object of the install, in apply order (CRDs and namespace first)."""
    ns = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}] if create_namespace else []
    return [*crd_objects(), *ns, *operator_objects(values, release, namespace),
            *monitoring_objects(values, release, namespace)]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Multi-line strings (PromQL, dashboard JSON) as literal blocks, readable in the output.
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.split("\n")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objs: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120) for obj in objs)


def read_values_file(path: Path) -> dict[str, Any]:
    """A values file as a mapping; what is wrong with it, in one line (ValueError)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"values file {str(path)!r} does not exist") from None
    except OSError as error:
        raise ValueError(f"values file {str(path)!r} cannot be read: {error.strerror}") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"values file {str(path)!r} is not valid YAML{where}: {problem}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"values file {str(path)!r} must hold a mapping of values (key: value), "
                         f"not a {type(values).__name__}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="kubeinfer manifests",
        description="Print the kubeinfer install (CRDs, operator, RBAC, optional monitoring) as plain YAML: "
                    "what the Helm chart installs with the same values.")
    parser.add_argument("-f", "--values", action="append", type=Path, default=[], metavar="FILE",
                        help="values file, as for the chart (repeatable; later files win)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one value, e.g. monitoring.prometheusRule.enabled=true (repeatable)")
    parser.add_argument("-n", "--namespace", default=DEFAULT_NAMESPACE, help="namespace of the operator")
    parser.add_argument("--release", default=DEFAULT_RELEASE, help="name prefix, as the Helm release name")
    parser.add_argument("--no-namespace", dest="create_namespace", action="store_false",
                        help="leave the Namespace object out")
    parser.add_argument("--monitoring", action="store_true",
                        help="turn on every monitoring object (PodMonitor, PrometheusRule, dashboard, "
                             "kube-state-metrics config); the PodMonitor implies serviceMonitorMode=never")
    args = parser.parse_args(argv)
    try:
        overrides = [read_values_file(path) for path in args.values]
        if args.monitoring:
            overrides.append({"serviceMonitorMode": "never", "monitoring": {
                key: {"enabled": True} for key in ("podMonitor", "prometheusRule", "dashboard", "kubeStateMetrics")}})
        overrides.extend(parse_set(item) for item in args.set)
        values = resolve(*overrides)
    except ValueError as error:
        parser.exit(2, f"kubeinfer manifests: {error}\n")
    sys.stdout.write(dump(render(values, args.release, args.namespace, args.create_namespace)))


if __name__ == "__main__":
    main()
