"""Command line and environment settings reach the operator's configuration and kopf."""

from __future__ import annotations

import signal
from typing import Any

import kopf
import pytest

from kubeinfer.operator import __main__ as entry
from kubeinfer.operator import peering, preflight
from kubeinfer.operator.config import OperatorConfig


def test_env_settings_are_read() -> None:
    config = OperatorConfig.from_env({"KUBEINFER_RUNTIME_IMAGE": "r/i:2", "KUBEINFER_NAMESPACES": "a, b",
                                      "KUBEINFER_STANDALONE": "true", "KUBEINFER_PRIORITY": "5",
                                      "KUBEINFER_SERVICE_MONITOR": "never", "KUBEINFER_SCANNING": "false"})
    assert config.runtime_image == "r/i:2" and config.namespaces == ("a", "b")
    assert config.standalone is True and config.priority == 5
    assert config.service_monitor == "never" and config.scanning is False
    with pytest.raises(ValueError, match="SERVICE_MONITOR"):
        OperatorConfig.from_env({"KUBEINFER_SERVICE_MONITOR": "sometimes"})


def test_main_passes_flags_and_the_peering_mode_to_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(kopf, "configure", lambda **kwargs: None)
    # The cluster: reachable, with no peering object anywhere.
    monkeypatch.setattr(entry, "startup_checks", lambda config: peering.choose(config, lambda path: False))
    for name in ("KUBEINFER_STANDALONE", "KUBEINFER_PEERING"):
        monkeypatch.delenv(name, raising=False)
    entry.main(["-n", "ml", "-n", "ml-*", "--peering", "team-a", "--priority", "10", "--runtime-image", "x/y:1"])
    assert seen["namespaces"] == ["ml", "ml-*"] and seen["clusterwide"] is False
    assert seen["peering_name"] == "team-a" and seen["priority"] == 10 and seen["standalone"] is False
    assert seen["memo"]["config"].runtime_image == "x/y:1"
    entry.main(["--standalone"])
    assert seen["standalone"] is True and seen["peering_name"] is None and seen["clusterwide"] is True
    entry.main([])   # out of the box: no peering object, so it acts alone
    assert seen["standalone"] is True and seen["peering_name"] is None
    # kopf ran on its own thread with a stop flag (the signal is main's), and main returned: no signal, no exit
    assert seen["stop_flag"] is not None and not seen["stop_flag"].is_set()
    assert signal.getsignal(signal.SIGTERM) is not None and entry.STOP_BUDGET_SECONDS <= 1.0


def test_main_exits_with_one_line_when_the_cluster_is_unusable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(kopf, "configure", lambda **kwargs: None)
    monkeypatch.setattr(kopf, "run", lambda **kwargs: pytest.fail("kopf must not start"))

    def unusable(config: OperatorConfig) -> None:
        raise preflight.ClusterUnusable("the API server at https://k refused the credentials (401 Unauthorized)")
    monkeypatch.setattr(entry, "startup_checks", unusable)
    with pytest.raises(SystemExit) as exited:
        entry.main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == ("kubeinfer operator: error: the API server at https://k refused the "
                                       "credentials (401 Unauthorized)\n")
