"""The operator at fleet scale: N InferenceServices on a real API server with a fake GPU node.

    K8S_LOCAL=/work/k8s-local FRESH=1 bash ../shared/k8s-local/up.sh
    python -P benchmarks/operator_scale.py --kubeconfig /work/k8s-local/kubeconfig [--count 1000]

Starts a fake node (`shared/k8s-local/fake_node.py`, room for every pod), `kubeinfer operator -n
kubeinfer-scale` as a process on this machine behind a counting proxy (benchmarks/api_counter.py: every request
the operator makes is recorded), and a stand-in Prometheus that counts the autoscaler's queries
(benchmarks/fake_prometheus.py). Each InferenceService is a CPU model of one replica (10m CPU, 256Mi), so a pod
costs the cluster only its objects. Then, in order:
  apply     create N InferenceServices; seconds until every Deployment exists
  latency   20 spec changes (runtime.maxModelLen) of random services while the fleet idles; seconds from the
            patch until the Deployment carries the new desired hash (P50, P99)
  idle      the operator's writes during 30 s of idling
  resync    every watch stream cut (as on a watch timeout): the operator re-lists; its requests until idle
  restart   the operator stopped (SIGTERM) and started again; its requests until idle
  autoscale autoscaling turned on for every service (Prometheus source): queries and writes per interval
RSS and CPU seconds of the operator process come from /proc after each phase. Needs a fresh control plane
(the namespace must not exist); leaves the fleet in place.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from kubernetes import client, config as kube_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_counter import ApiCounter, Request, count_by_verb, kubeconfig_for, resource_of  # noqa: E402
from fake_prometheus import FakePrometheus  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAKE_NODE = ROOT.parent / "shared" / "k8s-local" / "fake_node.py"
NAMESPACE = "kubeinfer-scale"
GROUP, VERSION, PLURAL = "kubeinfer.dev", "v1alpha1", "inferenceservices"
HASH = "kubeinfer.dev/desired-hash"
IDLE_S = 5.0            # no operator request other than a watch for this long: idle
PROGRESS_S = 60.0
AUTOSCALE_INTERVAL_S = 5.0


def service(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": name},
            "spec": {"model": {"uri": "file:///models/tiny", "servedName": name},
                     "resources": {"gpus": 0, "cpu": "10m", "memory": "256Mi"},
                     "runtime": {"maxModelLen": 512}, "replicas": 1}}


def create_crds() -> None:
    """The project's CRDs on the cluster of the loaded kubeconfig (those there already are left as they are)."""
    crds = client.ApiextensionsV1Api()
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for doc in filter(None, yaml.safe_load_all(path.read_text())):
            try:
                crds.create_custom_resource_definition(doc)
            except client.ApiException as error:
                if error.status != 409:
                    raise
    time.sleep(2)   # the CRD becomes served


class Rows(list):
    """The table's rows, each also printed as soon as it is measured (a long run shows its progress)."""

    WIDTH = 52

    def append(self, row: tuple[str, str]) -> None:
        super().append(row)
        print(f"{row[0]:<{self.WIDTH}}  {row[1]}", flush=True)


class OperatorProcess:
    def __init__(self, kubeconfig: str, prometheus_url: str, log_path: Path) -> None:
        self.kubeconfig, self.prometheus_url, self.log_path = kubeconfig, prometheus_url, log_path
        self.proc: subprocess.Popen | None = None
        self.cpu_before_s = 0.0   # CPU of earlier processes (restarts)

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "KUBEINFER_PROMETHEUS_URL": self.prometheus_url,
               "KUBEINFER_SERVICE_MONITOR": "never",
               "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": str(AUTOSCALE_INTERVAL_S)}
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.operator", "-n", NAMESPACE, "--standalone"],
                                     cwd="/", env=env, stdout=self.log_path.open("a"), stderr=subprocess.STDOUT)

    def stop(self, timeout_s: float = 60) -> float:
        """SIGTERM, then SIGKILL after timeout_s; returns how long it took to exit."""
        assert self.proc is not None
        self.cpu_before_s += self.cpu_s()
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"the operator did not stop within {timeout_s:.0f} s of SIGTERM: killed", flush=True)
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - started

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def wait_idle(counter: ApiCounter, since: float, timeout_s: float) -> float:
    """Wait until the operator has had no request other than a watch in flight for IDLE_S (an answer the loaded API
    server takes seconds to give is not idleness); returns when its last one started or ended.
    Says every PROGRESS_S how many requests it has made since `since` (at 1,000 services this takes many minutes)."""
    deadline = time.monotonic() + timeout_s
    said = time.monotonic()
    while time.monotonic() < deadline:
        last = max(counter.last_active, since)   # O(1): the proxy shares this process's one core at a time
        if counter.in_flight == 0 and time.monotonic() - last >= IDLE_S:
            return last
        if time.monotonic() - said >= PROGRESS_S:
            said = time.monotonic()
            print(f"  ... the operator is still busy: {len(counter.requests)} requests so far, "
                  f"{said - since:.0f} s since the phase began", flush=True)
        time.sleep(0.5)
    raise TimeoutError(f"the operator did not go idle within {timeout_s:.0f} s (--idle-limit)")


def describe(requests: list[Request]) -> str:
    verbs = count_by_verb(requests)
    return " ".join(f"{verb}={verbs[verb]}" for verb in sorted(verbs))


def describe_writes(requests: list[Request]) -> str:
    kinds = collections.Counter(f"{r.method} {resource_of(r.path)}" for r in requests if r.is_write)
    return ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()) or "none"


def writes(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.is_write]


def apply_all(custom: client.CustomObjectsApi, apps: client.AppsV1Api, names: list[str], timeout_s: float) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, service(n)),
                      names))
    while time.monotonic() - started < timeout_s:
        if len(apps.list_namespaced_deployment(NAMESPACE).items) >= len(names):
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"not every Deployment exists after {timeout_s:.0f} s")


def change_latency(custom: client.CustomObjectsApi, apps: client.AppsV1Api, name: str, max_model_len: int,
                   timeout_s: float = 60) -> float:
    before = apps.read_namespaced_deployment(name, NAMESPACE).metadata.annotations[HASH]
    started = time.monotonic()
    custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name,
                                          {"spec": {"runtime": {"maxModelLen": max_model_len}}})
    while time.monotonic() - started < timeout_s:
        if apps.read_namespaced_deployment(name, NAMESPACE).metadata.annotations[HASH] != before:
            return time.monotonic() - started
        time.sleep(0.02)
    raise TimeoutError(f"{name}: the Deployment did not change within {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=not os.environ.get("KUBECONFIG"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--proxy-port", type=int, default=18443)
    parser.add_argument("--prometheus-port", type=int, default=19090)
    parser.add_argument("--log", type=Path, default=Path("/tmp/operator_scale.log"))
    parser.add_argument("--idle-limit", type=float, default=None,
                        help="seconds a phase may take to go idle before the run gives up (default: 120 + 3 per service)")
    args = parser.parse_args()
    timeout_s = args.idle_limit or 120 + args.count * 3.0

    kube_config.load_kube_config(config_file=args.kubeconfig)
    core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
    create_crds()
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    names = [f"svc-{i:04d}" for i in range(args.count)]
    fake_node = subprocess.Popen([sys.executable, "-P", str(FAKE_NODE), "--name", "scale-node", "--gpus", "8",
                                  "--pods", str(args.count + 50), "--cpu", "64", "--kubeconfig", args.kubeconfig],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counter = ApiCounter(args.kubeconfig, args.proxy_port)
    prometheus = FakePrometheus(NAMESPACE, names, args.prometheus_port)
    operator = OperatorProcess(kubeconfig_for(counter.url), prometheus.url, args.log)
    rows = Rows()
    try:
        operator.start()
        while not any(r.is_watch and r.path.endswith(PLURAL) for r in counter.requests):
            time.sleep(0.2)
        time.sleep(1)

        start = time.monotonic()
        rows.append(("apply-all: every Deployment exists (s)", f"{apply_all(custom, apps, names, timeout_s):.1f}"))
        last = wait_idle(counter, start, timeout_s)
        made = counter.since(start)
        rows.append(("apply-all: until the operator is idle (s)", f"{last - start:.1f}"))
        rows.append(("apply-all: operator requests", describe(made)))
        rows.append(("apply-all: operator writes", describe_writes(made)))
        rows.append(("RSS after apply (MiB) / CPU (s)", f"{operator.rss_mib():.0f} / {operator.cpu_s():.1f}"))

        rng = random.Random(0)
        latencies = []
        for k in range(args.samples):
            latencies.append(change_latency(custom, apps, rng.choice(names), 1024 + k))
            time.sleep(0.2)
        cuts = statistics.quantiles(latencies, n=100, method="inclusive")
        rows.append(("reconcile latency P50 / P99 (s)", f"{statistics.median(latencies):.3f} / {cuts[98]:.3f}"))

        wait_idle(counter, time.monotonic(), timeout_s)
        start, cpu = time.monotonic(), operator.cpu_s()
        time.sleep(30)
        rows.append(("idle 30 s: operator writes / requests", f"{len(writes(counter.since(start)))} / "
                     f"{len(counter.since(start))}; CPU {operator.cpu_s() - cpu:.1f} s"))

        start, cpu = time.monotonic(), operator.cpu_s()
        cut = counter.cut_watches()
        last = wait_idle(counter, start, timeout_s)
        made = counter.since(start)
        rows.append((f"no-op resync ({cut} watches cut): writes", f"{len(writes(made))}"))
        rows.append(("no-op resync: requests, seconds, CPU s",
                     f"{describe(made)}; {last - start:.1f} s; CPU {operator.cpu_s() - cpu:.1f}"))

        rows.append(("restart: seconds from SIGTERM to exit", f"{operator.stop():.1f}"))
        start = time.monotonic()
        operator.start()
        while not any(r.is_watch and r.path.endswith(PLURAL) for r in counter.since(start)):
            time.sleep(0.2)   # started (on a loaded box its imports alone can outlast IDLE_S, and read as idle)
        last = wait_idle(counter, start, timeout_s)
        made = counter.since(start)
        rows.append(("restart: writes until idle", f"{len(writes(made))}"))
        rows.append(("restart: requests, seconds to idle, CPU s",
                     f"{describe(made)}; {last - start:.1f} s; CPU {operator.cpu_s():.1f}"))
        rows.append(("restart: writes", describe_writes(made)))
        rows.append(("RSS after restart (MiB)", f"{operator.rss_mib():.0f}"))

        autoscaling = {"minReplicas": 1, "maxReplicas": 2, "targetQueueDepthPerReplica": 4}
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda n: custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, n, {"spec": {"autoscaling": autoscaling}}), names))
        time.sleep(4 * AUTOSCALE_INTERVAL_S)
        start, cpu, window_s = time.monotonic(), operator.cpu_s(), 6 * AUTOSCALE_INTERVAL_S
        time.sleep(window_s)
        passes = window_s / AUTOSCALE_INTERVAL_S
        made = counter.since(start)
        rows.append(("autoscale: Prometheus queries per interval", f"{len(prometheus.since(start)) / passes:.0f}"))
        rows.append(("autoscale: operator writes / requests per interval",
                     f"{len(writes(made)) / passes:.0f} / {len(made) / passes:.0f}; "
                     f"CPU {(operator.cpu_s() - cpu) / passes:.2f} s"))
        rows.append(("autoscale: writes in the window", describe_writes(made)))
        rows.append(("RSS at the end (MiB)", f"{operator.rss_mib():.0f}"))
    finally:
        try:
            if operator.proc is not None and operator.proc.poll() is None:
                operator.stop()
        finally:
            fake_node.terminate()
            fake_node.wait(30)

    print(f"\noperator at fleet scale: {args.count} InferenceServices, {os.cpu_count()} CPUs, log {args.log}")
    for key, value in rows:
        print(f"{key:<{Rows.WIDTH}}  {value}")


if __name__ == "__main__":
    main()
