"""A thin JSON client over the official ``kubernetes`` client's connection (auth, TLS, proxies).

The operator talks to a handful of resources by URL; JSON dicts in, JSON dicts out, so what is
sent is exactly what the builders produced. Errors surface as ``kubernetes.client.ApiException``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any
from urllib.parse import urlencode

import kopf
import kubernetes
from kubernetes.client import ApiClient, ApiException, Configuration

log = logging.getLogger(__name__)

FIELD_MANAGER = "kubeinfer-operator"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "InferenceService": "inferenceservices",
    "Pod": "pods",
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "InferencePool": "inferencepools",
}


def load_configuration() -> Configuration:
    """In-cluster service account first, else $KUBECONFIG / ~/.kube/config."""
    config = Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(config_file=path, client_configuration=config)
    return config


def connection_info(config: Configuration) -> kopf.ConnectionInfo:
    """The same credentials, as kopf wants them, so kopf and the applier share one login."""
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None,
                  subresource: str | None = None) -> str:
    group, _, version = api_version.rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    if name is not None:
        path += f"/{name}"
    if subresource is not None:
        path += f"/{subresource}"
    return path


def object_path(obj: dict[str, Any], subresource: str | None = None) -> str:
    meta = obj["metadata"]
    return resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta.get("name"), subresource)


class Kube:
    """JSON requests against the API server; one instance per operator process."""

    def __init__(self, config: Configuration) -> None:
        self.api = ApiClient(config)

    def request(self, method: str, path: str, *, body: Any = None, query: dict[str, str] | None = None,
                content_type: str = "application/json", timeout: float | None = None,
                accept: str = "application/json") -> dict[str, Any]:
        url = path + (f"?{urlencode(query)}" if query else "")
        method, full_url, headers, body, _ = self.api.param_serialize(
            method, url, header_params={"Content-Type": content_type, "Accept": accept},
            body=body, auth_settings=["BearerToken"])
        response = self.api.call_api(method, full_url, header_params=headers, body=body, _request_timeout=timeout)
        response.read()
        text = response.data.decode("utf-8") if response.data else ""
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        return json.loads(text) if text else {}

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        return self.request("GET", path, query=query).get("items") or []

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply, taking ownership of every field in ``obj`` (force)."""
        return self.request("PATCH", object_path(obj), body=obj, content_type=APPLY_PATCH,
                            query={"fieldManager": FIELD_MANAGER, "force": "true"})

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        path = resource_path(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"])
        return self.request("POST", path, body=obj, query={"fieldManager": FIELD_MANAGER})

    def patch_status(self, obj_path: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", obj_path + "/status", body={"status": status}, content_type=MERGE_PATCH,
                            query={"fieldManager": FIELD_MANAGER})

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> bool:
        """Merge-patches the pod's annotations (the ReplicaSet controller owns the rest of the pod); False if the pod
        is gone meanwhile."""
        try:
            self.request("PATCH", resource_path("v1", "Pod", namespace, name),
                         body={"metadata": {"annotations": annotations}}, content_type=MERGE_PATCH,
                         query={"fieldManager": FIELD_MANAGER})
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def has_api(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` (e.g. a CRD is installed)."""
        try:
            found = self.request("GET", f"/apis/{group_version}")
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or [])
