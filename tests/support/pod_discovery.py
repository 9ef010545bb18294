"""Prometheus HTTP service discovery of a namespace's pods, read from the API server on every refresh.

Debian's `prometheus` (2.42) is built without `kubernetes_sd_configs`, so the real-cluster suite feeds its
`http_sd_configs` from here instead: the same pods, with the same `__meta_kubernetes_pod_*` labels that the
pod role of kubernetes_sd gives, so one set of relabel rules serves both (docs/e2e.md has both configs).
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support import free_port


def _label(prefix: str, key: str) -> str:
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def target_groups(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One group per pod with an IP and a container port, as the pod role lists them."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        if not status.get("podIP"):
            continue
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        labels = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
                  "__meta_kubernetes_pod_ip": status["podIP"], "__meta_kubernetes_pod_ready": str(ready).lower(),
                  "__meta_kubernetes_pod_phase": status.get("phase", "")}
        labels |= {_label("__meta_kubernetes_pod_label_", k): v for k, v in (meta.get("labels") or {}).items()}
        labels |= {_label("__meta_kubernetes_pod_annotation_", k): v
                   for k, v in (meta.get("annotations") or {}).items()}
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                groups.append({"targets": [f"{status['podIP']}:{port['containerPort']}"], "labels": {
                    **labels, "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}})
    return groups


class PodDiscovery:
    """Serves the target groups of `namespace` on 127.0.0.1; `url` goes into http_sd_configs."""

    def __init__(self, kube: Any, namespace: str):
        path = f"/api/v1/namespaces/{namespace}/pods"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                body = json.dumps(target_groups(kube.list(path))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/targets"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(discovery_url: str) -> dict[str, Any]:
    """Pods found through the API server, kept when annotated for scraping, labelled as the autoscaler's
    PromQL expects (namespace, service = the InferenceService, pod). With a Prometheus built with
    kubernetes_sd_configs, `{"role": "pod", "namespaces": {"names": [ns]}}` replaces the http_sd_configs
    and the relabel rules stay the same (support/pod_discovery.py says why Debian's cannot)."""
    return {
        "job_name": "kubeinfer-pods", "scrape_interval": "1s",
        "http_sd_configs": [{"url": discovery_url, "refresh_interval": "2s"}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "regex": "true",
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_ip", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
             "regex": "(.+);(.+)", "replacement": "$1:$2", "target_label": "__address__"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_label_kubeinfer_dev_inferenceservice"],
             "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }
