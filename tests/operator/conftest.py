"""Fixtures for the operator tests: an emulated API server (kmock) and the operator running against it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support import operator_harness as harness

NAMESPACE = harness.NAMESPACE


@pytest.fixture()
def cluster(kmock: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """kmock serving the built-in resources and our CRD, with a kubeconfig pointing at it."""
    return harness.serve_cluster(kmock, tmp_path, monkeypatch)


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
