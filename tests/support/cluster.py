"""Helpers of the real-cluster suite (tests/e2e): waiting, the operator as a process, pods and their metrics.

Importable as `support.cluster`; nothing here runs unless a test of tests/e2e calls it.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from support.manifests import condition  # noqa: F401  (the e2e tests read conditions through this module)

GROUP_PATH = "/apis/kubeinfer.dev/v1alpha1"


def eventually(fn: Callable[[], Any], timeout: float = 60, what: str = "condition", interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001  (a 404 while an object is being created)
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


# Namespaces this run made and has not deleted yet: the suite's last teardown deletes what is left.
CREATED_NAMESPACES: set[str] = set()


def make_namespace(kube: Any) -> str:
    ns = f"kubeinfer-e2e-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    CREATED_NAMESPACES.add(ns)
    return ns


@contextmanager
def namespace_scene(kube: Any) -> Iterator[tuple[str, ExitStack]]:
    """A fresh namespace and an ExitStack for what a fixture starts in it. On exit, whatever failed (a process
    that never came up included), the callbacks run last-in first-out, then the namespace is deleted."""
    ns = make_namespace(kube)
    with ExitStack() as stack:
        stack.callback(release_and_delete_namespace, kube, ns)
        yield ns, stack


def start_operator(stack: ExitStack, kube: Any, operator: OperatorProcess) -> OperatorProcess:
    """Starts the operator with its teardown on `stack`: its InferenceServices deleted while it still runs
    (see `delete_inference_services`), then the process stopped; a failed start still stops it."""
    stack.callback(operator.stop)
    operator.start()
    stack.callback(delete_inference_services, kube, operator.namespace)
    return operator


def delete_inference_services(kube: Any, ns: str, timeout: float = 120) -> None:
    """Deletes the namespace's InferenceServices and waits until they are gone. Call it while the operator
    still runs: an autoscaled one carries kopf's finalizer, which only the operator releases (a namespace
    deleted after the operator stopped would hang in Terminating)."""
    path = f"{GROUP_PATH}/namespaces/{ns}/inferenceservices"
    for obj in kube.list(path):
        kube.request("DELETE", f"{path}/{obj['metadata']['name']}")
    eventually(lambda: not kube.list(path), timeout, f"the InferenceServices of {ns} gone")


def delete_namespace(kube: Any, ns: str) -> None:
    from kubernetes.client import ApiException
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{ns}")
    except ApiException as e:
        if e.status != 404:
            raise
    CREATED_NAMESPACES.discard(ns)


def release_and_delete_namespace(kube: Any, ns: str) -> None:
    """Deletes the namespace after dropping kopf's finalizer from InferenceServices still in it: when this runs
    no operator is left to release it, and the namespace would hang in Terminating."""
    path = f"{GROUP_PATH}/namespaces/{ns}/inferenceservices"
    try:
        for obj in kube.list(path):
            if obj["metadata"].get("finalizers"):
                kube.request("PATCH", f"{path}/{obj['metadata']['name']}", body={"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
    finally:
        delete_namespace(kube, ns)


def delete_leftovers(kube: Any) -> list[str]:
    """The namespaces of this run still there (a fixture that could not finish) deleted; returns their names."""
    left = sorted(CREATED_NAMESPACES)
    for ns in left:
        release_and_delete_namespace(kube, ns)
    return left


class OperatorProcess:
    """`kubeinfer operator -n NS` in its own process, as a user starts it; no other flag unless given."""

    def __init__(self, namespace: str, log: Path, image: str | None = None, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()):
        self.namespace, self.log_path = namespace, log
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEINFER_")}
        self.env |= {"KUBECONFIG": os.environ["KUBECONFIG"], **({"KUBEINFER_RUNTIME_IMAGE": image} if image else {}),
                     **(env or {})}
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.operator", "-n", self.namespace,
                                      *self.args], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd="/")
        log.close()
        eventually(lambda: "Activity 'login' succeeded" in self.output() or self.proc.poll() is not None,
                   timeout=60, what="the operator to log in", interval=0.2)
        assert self.proc.poll() is None, f"the operator exited:\n{self.output()[-3000:]}"
        time.sleep(1.5)  # its watch streams open
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def isvc_path(ns: str, name: str) -> str:
    return f"{GROUP_PATH}/namespaces/{ns}/inferenceservices/{name}"


def pods_of(kube: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return kube.list(f"/api/v1/namespaces/{ns}/pods", f"kubeinfer.dev/inferenceservice={name}")


def is_ready(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", []))


def ready_pods(kube: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(kube, ns, name) if is_ready(p)]


def pod_counter(pod: dict[str, Any], metric: str = "kubeinfer_request_success_total") -> float:
    """Sum of one counter in a pod's own /metrics (straight to the pod, not through the Service)."""
    text = httpx.get(f"http://{pod['status']['podIP']}:8000/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(metric + "{") or line.startswith(metric + " "))


def service_url(kube: Any, ns: str, name: str) -> str:
    svc = kube.get(f"/api/v1/namespaces/{ns}/services/{name}")
    return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1"


def start_operator_in_process(namespace: str, **config: Any) -> tuple[threading.Thread, threading.Event]:
    """Our operator (kopf, standalone) on a thread of this process, watching `namespace` of the cluster the
    kubeconfig names, with OperatorConfig `config`. Returns once kopf says it is ready: (its thread, the event
    that stops it)."""
    import kopf
    from kubeinfer.operator import handlers  # noqa: F401  (registers the handlers)
    from kubeinfer.operator.config import OperatorConfig
    settings = OperatorConfig(namespaces=(namespace,), standalone=True, **config)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(kopf.operator(
        registry=kopf.get_default_registry(), memo=kopf.Memo(config=settings), standalone=True,
        namespaces=[namespace], stop_flag=stop, ready_flag=ready)), daemon=True)
    thread.start()
    assert ready.wait(30), "the operator did not start"
    return thread, stop
