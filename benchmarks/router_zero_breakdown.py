"""Where the time goes when a request at the operator's router scales an InferenceService up from zero.

    python -P benchmarks/router_zero_breakdown.py --kubeconfig K --image IMG

Runs `kubeinfer operator` (autoscaler every second) for a fresh namespace, applies the CPU demo model at 0
replicas with `spec.router: {}` and `autoscaling.minReplicas: 0`, waits for the router pod, then sends one
streamed completion through the router's ClusterIP Service while a thread polls, every 50 ms, the
InferenceService, the replica pod, the router pod's `kubeinfer.dev/router-endpoints` annotation and the router's
own /metrics; it prints when each step was first seen (seconds after the request was sent). Traffic goes only
to this cluster's pods and Services; the namespace is deleted at the end.
"""
import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", required=True, help="the CPU runtime image, already on the nodes")
    parser.add_argument("--workdir", default="/tmp/router-zero-breakdown", help="where the operator's log goes")
    args = parser.parse_args()
    os.environ["KUBECONFIG"] = args.kubeconfig
    sys.path.insert(0, str(ROOT / "tests"))
    import httpx
    from kubeinfer.operator.kube import Kube, load_configuration
    from support import streams
    from support.cluster import (OperatorProcess, delete_inference_services, delete_namespace, eventually,
                                 make_namespace, pods_of, ready_pods, service_url)

    kube = Kube(load_configuration())
    ns = make_namespace(kube)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    operator = OperatorProcess(ns, Path(args.workdir) / "operator.log", image=args.image,
                               env={"KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "1"}).start()
    isvc = f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices/zero"
    try:
        spec = {"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "runtime": {"imagePullPolicy": "IfNotPresent"},
                "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"}, "replicas": 0,
                "router": {"queueTimeoutSeconds": 180},
                "autoscaling": {"minReplicas": 0, "maxReplicas": 1, "metricWindowSeconds": 5,
                                "scaleToZeroIdleSeconds": 600, "scaleDownStabilizationSeconds": 0,
                                "initialDelaySeconds": 0}}
        kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
            "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "zero", "namespace": ns}, "spec": spec})

        def router_pods() -> list[dict]:
            return [p for p in kube.list(f"/api/v1/namespaces/{ns}/pods", "kubeinfer.dev/router=zero")
                    if not p["metadata"].get("deletionTimestamp")]

        def router_ready() -> bool:
            return any(c["type"] == "Ready" and c["status"] == "True"
                       for p in router_pods() for c in p["status"].get("conditions", []))
        eventually(router_ready, 120, "the router pod Ready", 0.3)
        router_pod = router_pods()[0]
        router_url = f"http://{router_pod['status']['podIP']}:8080"
        base = service_url(kube, ns, "zero-router")
        time.sleep(3)
        seen: dict[str, float] = {}
        stop = threading.Event()
        sent = time.monotonic()

        def watch() -> None:
            pod_path = f"/api/v1/namespaces/{ns}/pods/{router_pod['metadata']['name']}"
            while not stop.is_set():
                at = time.monotonic() - sent
                if kube.get(isvc)["spec"].get("replicas") == 1:
                    seen.setdefault("spec.replicas 0 -> 1", at)
                pods = pods_of(kube, ns, "zero")
                if pods:
                    seen.setdefault("replica pod created", at)
                if pods and pods[0]["status"].get("podIP"):
                    seen.setdefault("replica pod has an IP", at)
                if ready_pods(kube, ns, "zero"):
                    seen.setdefault("replica pod Ready (API server)", at)
                told = (kube.get(pod_path)["metadata"].get("annotations") or {}).get("kubeinfer.dev/router-endpoints")
                if told and told != "[]":
                    seen.setdefault("router pod's annotation lists it", at)
                try:
                    if "kubeinfer_router_replicas_up 1.0" in httpx.get(router_url + "/metrics", timeout=1).text:
                        seen.setdefault("the router counts it up", at)
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        result = streams.stream_completion(streams.client(base, timeout_s=180), "zero", "Kubernetes is", 16)
        seen["first token at the client"] = result.first_token_s or float("nan")
        time.sleep(0.5)
        stop.set()
        thread.join()
        for what, at in sorted(seen.items(), key=lambda item: item[1]):
            print(f"{at:6.2f} s  {what}")
        print(f"whole answer: {result.whole(16)}")
    finally:
        delete_inference_services(kube, ns)
        operator.stop()
        delete_namespace(kube, ns)


if __name__ == "__main__":
    main()
