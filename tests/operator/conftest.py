"""Fixtures for the operator tests: an emulated API server (kmock) and the operator running against it."""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest
import yaml

from kubeinfer.operator.spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

_spec = importlib.util.spec_from_file_location("kubeinfer_operator_harness", Path(__file__).with_name("harness.py"))
harness = importlib.util.module_from_spec(_spec)
sys.modules["kubeinfer_operator_harness"] = harness
_spec.loader.exec_module(harness)
NAMESPACE = harness.NAMESPACE


@pytest.fixture()
def cluster(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """kmock serving the built-in resources and our CRD, with a kubeconfig pointing at it."""
    kmock.resources.load_bundled()
    kmock.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock_lib.ResourceInfo(
        kind=KIND, singular=SINGULAR, shortnames=set(SHORT_NAMES), namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"}, subresources={"status", "scale"})
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": NAMESPACE}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return kmock


@pytest.fixture()
async def operator(cluster: Any) -> AsyncIterator[Any]:
    async with harness.running_operator(cluster):
        yield cluster


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubeinfer")


@pytest.fixture()
def kapi(cluster: Any) -> Any:
    """The test's own client, for what a person with kubectl would do."""
    return harness.KApi(str(cluster.url))
