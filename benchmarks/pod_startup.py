"""Where a replica's start-up goes, on a real node: pod created → scheduled → container running → serving →
Ready, with the runtime's own phases from its "ready in" log line.

    python benchmarks/pod_startup.py --kubeconfig K --image IMG [--image IMG2] [--startup-probe-period 2 1]
                                     [--repeat 3]

Each pod is the one the operator builds for the CPU demo InferenceService (examples/cpu-demo.yaml), made as
a bare Pod (no operator needed) in the namespace `kubeinfer-startup-bench`; every image × startup-probe
period is measured `--repeat` times, one after the other, in one run. The client polls the pod every 50 ms
and asks the pod IP's `/ready` itself, so "serving" is when the runtime could first answer and "Ready" is when
Kubernetes noticed (the gap is the probes' doing). Traffic goes only to this cluster's pods.
"""
import argparse
import re
import statistics
import time
from pathlib import Path

import httpx
import yaml
from kubernetes import client, config as kube_config
from kubernetes.client.rest import ApiException

from kubeinfer.operator import pod as pods
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.spec import InferenceServiceSpec

NAMESPACE = "kubeinfer-startup-bench"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu-demo.yaml"
READY_LINE = re.compile(r"ready in ([\d.]+) s: (.*)")


def demo_pod(name: str, image: str, startup_period: int | None) -> dict:
    spec = InferenceServiceSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])
    body = pods.pod_spec(spec, "demo", OperatorConfig())
    container = body["containers"][0]
    container["image"], container["imagePullPolicy"] = image, "Never"
    if startup_period is not None:
        probe = container["startupProbe"]
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        probe["periodSeconds"], probe["failureThreshold"] = startup_period, -(-budget // startup_period)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "startup-bench"}},
            "spec": body}


def condition_true(pod, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in (pod.status.conditions or []))


def measure(core: client.CoreV1Api, image: str, startup_period: int | None, index: int) -> dict[str, float]:
    name = f"startup-{index}"
    created = time.monotonic()
    core.create_namespaced_pod(NAMESPACE, demo_pod(name, image, startup_period))
    marks: dict[str, float] = {}
    with httpx.Client(timeout=0.5) as http:
        while "ready" not in marks:
            if time.monotonic() - created > 180:
                raise RuntimeError(f"{name} not Ready in 180 s")
            pod = core.read_namespaced_pod(name, NAMESPACE)
            now = time.monotonic() - created
            if "scheduled" not in marks and condition_true(pod, "PodScheduled"):
                marks["scheduled"] = now
            statuses = pod.status.container_statuses or []
            if "running" not in marks and statuses and statuses[0].state.running:
                marks["running"] = now
            if "serving" not in marks and pod.status.pod_ip and "running" in marks:
                try:
                    if http.get(f"http://{pod.status.pod_ip}:{pods.PORT}/ready").status_code == 200:
                        marks["serving"] = time.monotonic() - created
                except httpx.TransportError:
                    pass
            if condition_true(pod, "Ready"):
                marks["ready"] = now
                marks.setdefault("serving", now)
            time.sleep(0.05)
    log = core.read_namespaced_pod_log(name, NAMESPACE)
    if match := READY_LINE.search(log):
        for part in match.group(2).split(", "):
            phase, seconds, _unit = part.rsplit(" ", 2)
            marks["runtime " + phase] = float(seconds)
        marks["runtime ready"] = float(match.group(1))
    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    while True:
        try:
            core.read_namespaced_pod(name, NAMESPACE)
            time.sleep(0.2)
        except ApiException as error:
            if error.status == 404:
                return marks
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", action="append", required=True, help="repeatable: images to compare")
    parser.add_argument("--startup-probe-period", type=int, nargs="+", default=[None],
                        help="startup probe periods (s) to compare; default: the operator's")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    kube_config.load_kube_config(args.kubeconfig)
    core = client.CoreV1Api()
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as error:
        if error.status != 409:
            raise
    index = 0
    for image in args.image:
        for period in args.startup_probe_period:
            runs = []
            for _ in range(args.repeat):
                index += 1
                runs.append(measure(core, image, period, index))
                print(f"  {image} period {period}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()),
                      flush=True)
            keys = [k for k in runs[0] if all(k in r for r in runs)]
            label = f"{image}, startup probe every {period or pods.STARTUP_PERIOD_SECONDS} s"
            print(f"## {label}: median of {len(runs)} (s)")
            print("| " + " | ".join(keys) + " |")
            print("|" + "---|" * len(keys))
            print("| " + " | ".join(f"{statistics.median(r[k] for r in runs):.2f}" for k in keys) + " |", flush=True)


if __name__ == "__main__":
    main()
