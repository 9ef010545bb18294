"""Where a replica's start-up goes, on a real node: pod created → scheduled → container running → serving →
Ready, with the runtime's own phases from its "ready in" log line.

    python benchmarks/pod_startup.py --kubeconfig K --image IMG [--image IMG2] [--startup-probe-period 2 1]
                                     [--repeat 3] [--model-host-path DIR [--evict] [--memory 8Gi]]

Each pod is the one the operator builds for the CPU demo InferenceService (examples/cpu-demo.yaml), made as
a bare Pod (no operator needed) in the namespace `kubeinfer-startup-bench`; every image × startup-probe
period is measured `--repeat` times, one after the other, in one run. The client polls the pod every 50 ms
and asks the pod IP's `/ready` itself, so "serving" is when the runtime could first answer and "Ready" is when
Kubernetes noticed (the gap is the probes' doing). Traffic goes only to this cluster's pods.

`--model-host-path DIR` serves a model folder of the node instead (e.g. benchmarks/weights_load.py's
1B-shaped checkpoint): a PersistentVolume of type hostPath on DIR and its claim, and the spec's model
`pvc://CLAIM/NAME` (NAME: DIR's last part), as a user serves weights from a volume. `--evict` drops the
folder's safetensors from the page cache before each pod (posix_fadvise DONTNEED, run here: only for a node
that is this machine), so its weights come from the disk; without it they come from the page cache after the
first pod.
"""
import argparse
import os
import re
import statistics
import time
from pathlib import Path

import httpx
import yaml
from kubernetes import client, config as kube_config
from kubernetes.client.rest import ApiException

from kubeinfer.operator.reconcile import pod as pods
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.spec import InferenceServiceSpec

NAMESPACE = "kubeinfer-startup-bench"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpu-demo.yaml"
READY_LINE = re.compile(r"ready in ([\d.]+) s: (.*)")


def demo_pod(name: str, image: str, startup_period: int | None, overrides: dict | None = None) -> dict:
    """`overrides`: spec sections whose fields replace the example's (e.g. {"model": {"uri": ...}})."""
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]
    for section, fields in (overrides or {}).items():
        raw[section] = {**raw.get(section, {}), **fields}
    spec = InferenceServiceSpec.model_validate(raw)
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


CLAIM = "startup-bench-model"
VOLUME = f"{NAMESPACE}-model"


def delete_host_model(core: client.CoreV1Api) -> None:
    """Deletes the claim and volume of `host_model` and waits until they are gone."""
    for delete, read in ((lambda: core.delete_namespaced_persistent_volume_claim(CLAIM, NAMESPACE),
                          lambda: core.read_namespaced_persistent_volume_claim(CLAIM, NAMESPACE)),
                         (lambda: core.delete_persistent_volume(VOLUME), lambda: core.read_persistent_volume(VOLUME))):
        try:
            delete()
            while read():
                time.sleep(0.2)
        except ApiException as error:
            if error.status != 404:
                raise


def host_model(core: client.CoreV1Api, host_path: Path) -> dict:
    """A hostPath PersistentVolume on `host_path`'s parent, bound to a claim; returns the spec's model section."""
    claim, volume = CLAIM, VOLUME
    delete_host_model(core)
    core.create_persistent_volume({
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(host_path.parent), "type": "Directory"},
                 "claimRef": {"namespace": NAMESPACE, "name": claim}}})
    core.create_namespaced_persistent_volume_claim(NAMESPACE, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": volume,
                 "resources": {"requests": {"storage": "10Gi"}}}})
    return {"uri": f"pvc://{claim}/{host_path.name}"}


def evict(model_dir: Path) -> None:
    """Drops the model's safetensors from this machine's page cache (the node's, when the node is here)."""
    for file in model_dir.glob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure(core: client.CoreV1Api, image: str, startup_period: int | None, index: int,
            overrides: dict | None = None) -> dict[str, float]:
    name = f"startup-{index}"
    created = time.monotonic()
    core.create_namespaced_pod(NAMESPACE, demo_pod(name, image, startup_period, overrides))
    marks: dict[str, float] = {}
    with httpx.Client(timeout=0.5) as http:
        while "ready" not in marks:
            if time.monotonic() - created > 300:
                raise RuntimeError(f"{name} not Ready in 300 s")
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
    parser.add_argument("--model-host-path", type=Path, help="a model folder on the node, served via a hostPath PV")
    parser.add_argument("--evict", action="store_true", help="drop the model from the page cache before each pod")
    parser.add_argument("--memory", default=None, help="resources.memory of the pod (e.g. 8Gi)")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=None)
    args = parser.parse_args()
    kube_config.load_kube_config(args.kubeconfig)
    core = client.CoreV1Api()
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as error:
        if error.status != 409:
            raise
    overrides: dict[str, dict] = {}
    if args.model_host_path:
        overrides["model"] = host_model(core, args.model_host_path.resolve())
    if args.memory:
        overrides["resources"] = {"memory": args.memory}
    if args.kv_cache_memory_gib is not None:
        overrides["runtime"] = {"kvCacheMemoryGib": args.kv_cache_memory_gib}
    index = 0
    for image in args.image:
        for period in args.startup_probe_period:
            runs = []
            for _ in range(args.repeat):
                index += 1
                if args.evict:
                    evict(args.model_host_path)
                runs.append(measure(core, image, period, index, overrides))
                print(f"  {image} period {period}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()),
                      flush=True)
            keys = [k for k in runs[0] if all(k in r for r in runs)]
            label = f"{image}, startup probe every {period or pods.STARTUP_PERIOD_SECONDS} s"
            print(f"## {label}: median of {len(runs)} (s)")
            print("| " + " | ".join(keys) + " |")
            print("|" + "---|" * len(keys))
            print("| " + " | ".join(f"{statistics.median(r[k] for r in runs):.2f}" for k in keys) + " |", flush=True)
    if args.model_host_path:
        delete_host_model(core)


if __name__ == "__main__":
    main()
