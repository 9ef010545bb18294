"""The kopf settings the startup handler makes, read back from kopf's own settings object."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from kubeinfer.operator import handlers
from kubeinfer.operator.config import OperatorConfig


class NoCluster:
    def __init__(self, _: Any) -> None:
        pass


def configured(monkeypatch: pytest.MonkeyPatch, config: OperatorConfig) -> kopf.OperatorSettings:
    monkeypatch.setattr(handlers, "load_configuration", lambda: None)
    monkeypatch.setattr(handlers, "Kube", NoCluster)
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=kopf.Memo(config=config))
    return settings


def test_reconcile_passes_run_on_the_configured_number_of_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    default = configured(monkeypatch, OperatorConfig(service_monitor="never"))
    assert default.execution.max_workers == OperatorConfig.handler_threads == 16
    assert default.execution.executor._max_workers == 16   # the pool kopf runs sync handlers in
    assert configured(monkeypatch, OperatorConfig(service_monitor="never", handler_threads=40)).execution.max_workers == 40


def test_handler_threads_come_from_the_environment_and_must_be_positive() -> None:
    assert OperatorConfig.from_env({"KUBEINFER_HANDLER_THREADS": "24"}).handler_threads == 24
    with pytest.raises(ValueError, match="KUBEINFER_HANDLER_THREADS"):
        OperatorConfig.from_env({"KUBEINFER_HANDLER_THREADS": "0"})
