"""Fixtures of the real-cluster suite (docs/e2e.md). Everything here is skipped without KUBEINFER_E2E_KUBECONFIG.

- `kube`: the project's own JSON client on that kubeconfig; `crds`: crds/ applied (server-side) once.
- `runtime_image`: KUBEINFER_E2E_IMAGE, loaded into the cluster once with KUBEINFER_E2E_LOAD_IMAGE
  (a command where `{image}` is replaced, e.g. `kind load docker-image {image}`); tests that run real
  pods skip without it.
- `OperatorProcess`: `kubeinfer operator` as a user runs it, a separate process on this machine with the
  kubeconfig (pods cannot reach the API server on every test cluster), its log kept for failures.
- `timings`: figures a test measured; printed at the end of the run (and written as JSON to
  KUBEINFER_E2E_REPORT when set).

The tests send traffic only to the cluster's own pod and Service addresses, bounded and self-stopping;
this machine must route to them (kind: see docs/e2e.md).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cluster import GROUP_PATH, delete_namespace, eventually, make_namespace

KUBECONFIG = os.environ.get("KUBEINFER_E2E_KUBECONFIG")
IMAGE = os.environ.get("KUBEINFER_E2E_IMAGE")
LOAD_IMAGE = os.environ.get("KUBEINFER_E2E_LOAD_IMAGE", "")
ROOT = Path(__file__).resolve().parents[2]
TIMINGS: dict[str, float] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="KUBEINFER_E2E_KUBECONFIG is not set (make e2e; docs/e2e.md)")
    for item in items:
        if not KUBECONFIG and "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
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
def kube() -> Any:
    os.environ["KUBECONFIG"] = KUBECONFIG or ""
    from kubeinfer.operator.kube import Kube, load_configuration
    return Kube(load_configuration())


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


@pytest.fixture(scope="session")
def runtime_image(timings: dict[str, float]) -> str:
    if not IMAGE:
        pytest.skip("KUBEINFER_E2E_IMAGE is not set: no runtime image to run pods with (make e2e sets it)")
    if LOAD_IMAGE:
        started = time.monotonic()
        subprocess.run(LOAD_IMAGE.replace("{image}", shlex.quote(IMAGE)), shell=True, check=True,
                       stdout=subprocess.DEVNULL)
        timings["image load into the cluster (KUBEINFER_E2E_LOAD_IMAGE)"] = time.monotonic() - started
    return IMAGE


