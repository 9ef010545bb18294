"""Faults of what runs the service, under steady load through the router (docs/e2e.md, "Chaos suite"): the
operator SIGKILLed mid-rollout and mid-scale (and started again once the change went on without it), the API
server restarted, the node's kubelet stopped for 30 s. Each: nothing lost, and the service back at its replica count.

The last two stop processes of the local cluster (../shared/k8s-local: its lib.sh stops a component by its pid
file, up.sh and node-up.sh start what is not running); they skip on another cluster. Whatever fails, each test
ends by starting again whatever of the cluster is not running (`restore_cluster`).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from support.chaos_scene import Scene, assert_nothing_lost, run_fault
from support.cluster import eventually, isvc_path, pods_of, ready_pods

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[3]
K8S_SCRIPTS = Path(os.environ.get("KUBEINFER_CHAOS_K8S_SCRIPTS", ROOT.parent / "shared" / "k8s-local"))
KUBELET_DOWN_S = 30
SCRIPT_LIMIT_S = 180   # up.sh and node-up.sh wait at most 90 s for what they start


def local_cluster() -> Path:
    """The local cluster's folder ($K8S_LOCAL: up.sh writes its kubeconfig there); skips on another cluster. Asked
    once, before the fault: stopping a component removes its pid file."""
    folder = Path(os.environ["KUBECONFIG"]).parent
    if not (K8S_SCRIPTS / "lib.sh").is_file() or not (folder / "run" / "kube-apiserver.pid").is_file():
        pytest.skip(f"not the local cluster of {K8S_SCRIPTS} (no run/kube-apiserver.pid beside the kubeconfig)")
    return folder


def cluster_script(folder: Path, command: str, *args: str) -> None:
    """A line of bash with the local cluster's lib.sh sourced, K8S_LOCAL set; `args` are its "$@"."""
    subprocess.run(["bash", "-c", f"source {K8S_SCRIPTS}/lib.sh && {command}", "bash", *args], check=True,
                   timeout=SCRIPT_LIMIT_S, env={**os.environ, "K8S_LOCAL": str(folder)}, stdout=subprocess.DEVNULL)


CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")   # what up.sh starts
NODE = ("containerd", "kubelet")   # what node-up.sh starts that a test here stops, or that stops with them


def restore_cluster(folder: Path) -> None:
    """Starts whatever of the control plane and the node is not running: up.sh if a part of the control plane is
    down, node-up.sh if a part of the node is. Not otherwise: node-up.sh imports the node's images again each time,
    and its check of them (`ctr images ls -q | grep -q` under pipefail) fails now and then on a busy box once grep
    has its match and ctr is still writing (SIGPIPE), which failed a run whose fault had passed."""
    down = " || ".join(f"! is_running {name}" for name in CONTROL_PLANE)
    node_down = " || ".join(f"! is_running {name}" for name in NODE)
    cluster_script(folder, f"if {down}; then bash {K8S_SCRIPTS}/up.sh; fi && "
                           f"if {node_down}; then bash {K8S_SCRIPTS}/node-up.sh; fi")


def node_ready(scene: Scene) -> bool:
    return all(any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
               for node in scene.kube.list("/api/v1/nodes"))


def deployment(scene: Scene) -> dict:
    return scene.kube.get(f"/apis/apps/v1/namespaces/{scene.ns}/deployments/{scene.name}")


def kill_operator(scene: Scene) -> None:
    scene.operator.proc.kill()
    scene.operator.proc.wait(30)


def test_the_operator_killed_mid_rollout_loses_nothing(scene: Scene) -> None:
    """A spec change starts a rollout; the operator is SIGKILLed once it has written the new pod template, and
    started again once a new pod is Ready and an old one is going (the router was not told meanwhile)."""
    def inject() -> None:
        generation = deployment(scene)["metadata"]["generation"]
        old = {p["metadata"]["name"] for p in pods_of(scene.kube, scene.ns, scene.name)}
        scene.kube.request("PATCH", isvc_path(scene.ns, scene.name), content_type="application/merge-patch+json",
                           body={"spec": {"runtime": {"env": [{"name": "CHAOS_ROLLOUT", "value": str(time.time())}]}}})
        eventually(lambda: deployment(scene)["metadata"]["generation"] > generation, 60, "the new pod template")
        kill_operator(scene)
        eventually(lambda: any(p["metadata"]["name"] not in old for p in ready_pods(scene.kube, scene.ns, scene.name))
                   and any(p["metadata"]["name"] in old and p["metadata"].get("deletionTimestamp")
                           for p in pods_of(scene.kube, scene.ns, scene.name)),
                   300, "a new pod Ready and an old one going, without the operator", 0.5)
        scene.operator.start()
    try:
        row = run_fault(scene, "operator killed mid-rollout",
                        "SIGKILL once the new pod template is written; restarted when a new pod is Ready", inject)
    finally:
        if scene.operator.proc.poll() is not None:
            scene.operator.start()
    assert_nothing_lost(row)


@pytest.mark.parametrize("target", [3, 2], ids=["up", "down"])
def test_the_operator_killed_mid_scale_loses_nothing(scene: Scene, target: int) -> None:
    """spec.replicas changed; the operator SIGKILLed once it has written the Deployment's replicas, and started
    again once the Deployment has that many pods (Ready ones, scaling up)."""
    def inject() -> None:
        scene.kube.request("PATCH", isvc_path(scene.ns, scene.name), content_type="application/merge-patch+json",
                           body={"spec": {"replicas": target}})
        eventually(lambda: deployment(scene)["spec"]["replicas"] == target, 60, "the Deployment's replicas written")
        kill_operator(scene)
        scene.replicas = target
        eventually(lambda: len(ready_pods(scene.kube, scene.ns, scene.name)) == target
                   and len(pods_of(scene.kube, scene.ns, scene.name)) == target, 300,
                   f"{target} pods, without the operator", 0.5)
        scene.operator.start()
    try:
        row = run_fault(scene, f"operator killed mid-scale {scene.replicas}->{target}",
                        "SIGKILL once the Deployment's replicas is written; restarted when the pods are there", inject)
    finally:
        if scene.operator.proc.poll() is not None:
            scene.operator.start()
    assert_nothing_lost(row)


def test_the_api_server_restarted_loses_nothing(scene: Scene) -> None:
    folder = local_cluster()

    def inject() -> None:
        cluster_script(folder, "stop kube-apiserver")
        restore_cluster(folder)
    try:
        row = run_fault(scene, "API server restarted", "lib.sh stop kube-apiserver (SIGTERM), then up.sh", inject)
    finally:
        restore_cluster(folder)
    assert_nothing_lost(row)
    assert "Traceback" not in scene.operator.output()


def test_the_kubelet_stopped_for_30_s_loses_nothing(scene: Scene) -> None:
    folder = local_cluster()

    def inject() -> None:
        # Started again with its own command line: node-up.sh would first redo the node's network and images.
        pid = (folder / "run" / "kubelet.pid").read_text().strip()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
        cluster_script(folder, "stop kubelet")
        time.sleep(KUBELET_DOWN_S)
        cluster_script(folder, 'start kubelet "$@"', *command)
        eventually(lambda: node_ready(scene), SCRIPT_LIMIT_S, "the node Ready again", 0.5)
    try:
        row = run_fault(scene, f"kubelet stopped {KUBELET_DOWN_S} s",
                        f"lib.sh stop kubelet (SIGTERM), started again {KUBELET_DOWN_S} s later", inject)
    finally:
        restore_cluster(folder)
    assert_nothing_lost(row)
