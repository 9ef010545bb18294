"""Fixtures of the real-cluster suite (docs/e2e.md). Everything here is skipped without KUBEINFER_E2E_KUBECONFIG.

- `kube`: the project's own JSON client on that kubeconfig (a relative path is taken from the directory
  pytest starts in, and made absolute for every process the suite starts); `crds`: crds/ applied
  (server-side) once.
- `runtime_image`: KUBEINFER_E2E_IMAGE, loaded into the cluster once with KUBEINFER_E2E_LOAD_IMAGE
  (a command where `{image}` is replaced, e.g. `kind load docker-image {image}`); tests that run real
  pods skip without it. `operator_image`: KUBEINFER_E2E_OPERATOR_IMAGE, loaded the same way, for the
  operator the chart installs (tests/e2e/test_helm.py).
- `OperatorProcess`: `kubeinfer operator` as a user runs it, a separate process on this machine with the
  kubeconfig, its log kept for failures (test_helm.py runs it in the cluster, as the chart installs it).
- Cleanup: each fixture deletes what it made, whatever failed; namespaces of this run still there at the
  end (a fixture that could not finish) are deleted then, and named in the summary.
- `timings`: figures a test measured; printed at the end of the run (and written as JSON to
  KUBEINFER_E2E_REPORT when set).

The tests send traffic only to the cluster's own pod and Service addresses, bounded and self-stopping;
this machine must route to them (kind: see docs/e2e.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from support.cluster import GROUP_PATH, delete_leftovers, delete_namespace, eventually, make_namespace

# Absolute: the operator and router processes start in another directory (cwd "/").
KUBECONFIG = str(Path(os.environ["KUBEINFER_E2E_KUBECONFIG"]).expanduser().resolve()) \
    if os.environ.get("KUBEINFER_E2E_KUBECONFIG") else None
IMAGE = os.environ.get("KUBEINFER_E2E_IMAGE")
OPERATOR_IMAGE = os.environ.get("KUBEINFER_E2E_OPERATOR_IMAGE")
LOAD_IMAGE = os.environ.get("KUBEINFER_E2E_LOAD_IMAGE", "")
ROOT = Path(__file__).resolve().parents[2]
TIMINGS: dict[str, float] = {}
LEFTOVERS: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="KUBEINFER_E2E_KUBECONFIG is not set (make e2e; docs/e2e.md)")
    for item in items:
        if not KUBECONFIG and "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LEFTOVERS:
        terminalreporter.section("e2e cleanup")
        terminalreporter.write_line(f"deleted at the end, left by a fixture that could not finish: {LEFTOVERS}")
    if not TIMINGS:
        return
    terminalreporter.section("e2e timings (seconds)")
    for name, seconds in TIMINGS.items():
        terminalreporter.write_line(f"{name:<60} {seconds:8.2f}")
    if report := os.environ.get("KUBEINFER_E2E_REPORT"):
        Path(report).write_text(json.dumps(TIMINGS, indent=2))


@pytest.fixture(scope="session")
def timings() -> dict[str, float]:
    return TIMINGS


@pytest.fixture(scope="session")
def kube() -> Iterator[Any]:
    if not Path(KUBECONFIG or "").is_file():
        pytest.exit(f"KUBEINFER_E2E_KUBECONFIG={os.environ.get('KUBEINFER_E2E_KUBECONFIG')}: no such file "
                    f"(from {os.getcwd()}: {KUBECONFIG})", returncode=2)
    os.environ["KUBECONFIG"] = KUBECONFIG
    from kubeinfer.operator.kube import Kube, load_configuration
    client = Kube(load_configuration())
    yield client
    LEFTOVERS.extend(delete_leftovers(client))


@pytest.fixture(scope="session")
def crds(kube: Any) -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                kube.request("PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}",
                             body=doc, content_type="application/apply-patch+yaml",
                             query={"fieldManager": "kubeinfer-e2e", "force": "true"})

    def established() -> bool:
        crd = kube.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.kubeinfer.dev")
        return any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"].get("conditions", []))
    eventually(established, what="CRD established")
    # The schema just applied is the one the API server validates with (CEL rules included).
    eventually(lambda: kube.get(GROUP_PATH), what="CRD served")


@pytest.fixture()
def namespace(kube: Any, crds: None) -> Iterator[str]:
    ns = make_namespace(kube)
    yield ns
    delete_namespace(kube, ns)


def load_image(image: str, what: str, timings: dict[str, float]) -> str:
    if LOAD_IMAGE:
        started = time.monotonic()
        subprocess.run(LOAD_IMAGE.replace("{image}", shlex.quote(image)), shell=True, check=True,
                       stdout=subprocess.DEVNULL)
        timings[f"{what} image load into the cluster (KUBEINFER_E2E_LOAD_IMAGE)"] = time.monotonic() - started
    return image


@pytest.fixture(scope="session")
def runtime_image(timings: dict[str, float]) -> str:
    if not IMAGE:
        pytest.skip("KUBEINFER_E2E_IMAGE is not set: no runtime image to run pods with (make e2e sets it)")
    return load_image(IMAGE, "runtime", timings)


@pytest.fixture(scope="session")
def operator_image(timings: dict[str, float]) -> str:
    if not OPERATOR_IMAGE:
        pytest.skip("KUBEINFER_E2E_OPERATOR_IMAGE is not set: no operator image for the chart (make e2e sets it)")
    return load_image(OPERATOR_IMAGE, "operator", timings)




IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def _api_server_is_local() -> bool:
    """Whether the kubeconfig's current cluster is served on this machine's loopback (../shared/k8s-local): its
    node is then this machine, and traffic between pods is routed by this machine's kernel."""
    config = yaml.safe_load(Path(KUBECONFIG or "").read_text()) or {}
    context = next((c["context"] for c in config.get("contexts") or () if c["name"] == config.get("current-context")),
                   None) or {}
    cluster = next((c["cluster"] for c in config.get("clusters") or () if c["name"] == context.get("cluster")), None) or {}
    host = urlsplit(cluster.get("server", "")).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(scope="session")
def local_node(kube: Any) -> None:
    """For the tests whose pods call back to this machine (a trace receiver on the node's address): only the local
    cluster's node is this machine."""
    if not _api_server_is_local():
        pytest.skip("the pods must reach this machine: the local cluster only (../shared/k8s-local)")


@pytest.fixture(scope="session")
def pod_to_pod(kube: Any) -> None:
    """For the tests whose pods talk to each other (the router to its replicas, a replica's sidecar to a stand-in
    Hub pod): on the local cluster each pod reaches the pod range through the node's address on cni0, i.e. through
    this machine, which forwards only with net.ipv4.ip_forward=1. With 0, the host still reaches every pod and
    readiness probes pass; only pod-to-pod traffic is dropped, and those tests would wait out their deadlines
    (the router answers 503 "no replica became ready within N s"). Fail them at once with the cause instead."""
    if _api_server_is_local() and IP_FORWARD.is_file() and IP_FORWARD.read_text().strip() == "0":
        pytest.fail("net.ipv4.ip_forward is 0 on this machine, which is the local cluster's node: pods cannot reach "
                    "each other (the router its replicas, a replica a Hub pod). `sysctl -w net.ipv4.ip_forward=1` "
                    "(docs/e2e.md, \"The local cluster of this project\")", pytrace=False)
