"""The stand-in Hugging Face Hub (support/hub_standin.py) as a pod of the real cluster, serving repositories made
here, and the Secret that points a service's fetchers at it (`model.credentialsSecret`: HF_ENDPOINT)."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from support.cluster import eventually

HUB_PORT = 8080
STANDIN = Path(__file__).resolve().parent / "hub_standin.py"


def start_hub(kube: Any, ns: str, image: str, repos: dict[str, Path], name: str = "hub") -> str:
    """Starts the pod `name` serving each repository (its folder's files, flat), creates the Secret `name` with its
    HF_ENDPOINT and returns that URL once the pod is Ready."""
    base = f"/api/v1/namespaces/{ns}"
    kube.request("POST", f"{base}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-script"},
        "data": {"hub_standin.py": STANDIN.read_text()}})
    volumes = [{"name": "script", "configMap": {"name": f"{name}-script"}}]
    mounts = [{"name": "script", "mountPath": "/files"}]
    copies, served = [], []
    for index, (repo, folder) in enumerate(repos.items()):   # a ConfigMap each: one holds at most 1 MiB
        kube.request("POST", f"{base}/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-r{index}"},
            "binaryData": {f.name: base64.b64encode(f.read_bytes()).decode()
                           for f in sorted(folder.iterdir()) if f.is_file()}})
        volumes.append({"name": f"r{index}", "configMap": {"name": f"{name}-r{index}"}})
        mounts.append({"name": f"r{index}", "mountPath": f"/repos/r{index}"})
        copies.append(f"mkdir -p /tmp/r{index} && cp /repos/r{index}/* /tmp/r{index}/")
        served.append(f"{repo} /tmp/r{index}")
    first, *more = served
    command = " && ".join(copies) + f" && exec python3 /files/hub_standin.py {first} {HUB_PORT} {' '.join(more)}"
    kube.request("POST", f"{base}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [{
            "name": "hub", "image": image, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", command],
            "volumeMounts": mounts, "readinessProbe": {"tcpSocket": {"port": HUB_PORT}, "periodSeconds": 1}}],
            "volumes": volumes}})
    pod = eventually(lambda: (p := kube.get(f"{base}/pods/{name}")) and p["status"].get("podIP")
                     and any(c["type"] == "Ready" and c["status"] == "True"
                             for c in p["status"].get("conditions", [])) and p, 120, "the stand-in Hub pod Ready")
    url = f"http://{pod['status']['podIP']}:{HUB_PORT}"
    kube.request("POST", f"{base}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"HF_ENDPOINT": url}})
    return url
