"""`kubeinfer operator` out of the box: the peering mode it picks, and one line (no traceback) for a cluster
it cannot use."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer.operator import peering, preflight
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.kube import Kube, load_configuration
from support import free_port

CLUSTER_PEERING = "/apis/kopf.dev/v1/clusterkopfpeerings/kubeinfer"


def nothing_exists(path: str) -> bool:
    return False


def test_a_plain_start_acts_standalone_and_says_why() -> None:
    mode = peering.choose(OperatorConfig(), nothing_exists)
    assert mode.standalone and mode.name is None and mode.level == logging.INFO
    assert "no peering object 'kubeinfer' cluster-wide" in mode.message


def test_a_plain_start_peers_when_the_default_object_exists() -> None:
    mode = peering.choose(OperatorConfig(), lambda path: path == CLUSTER_PEERING)
    assert not mode.standalone and mode.name == "kubeinfer"


def test_asked_for_peering_without_its_object_waits_and_warns_with_the_fix() -> None:
    mode = peering.choose(OperatorConfig(peering="team-a", namespaces=("ml",)), nothing_exists)
    assert not mode.standalone and mode.name == "team-a" and mode.level == logging.WARNING
    assert "waits" in mode.message and "KopfPeering named 'team-a'" in mode.message and "--standalone" in mode.message


def test_standalone_wins_and_namespaced_peering_is_looked_up_per_literal_namespace() -> None:
    assert peering.choose(OperatorConfig(standalone=True), lambda path: True).standalone
    assert peering.peering_paths("p", ("ml", "team-*")) == ["/apis/kopf.dev/v1/namespaces/ml/kopfpeerings/p"]
    seen: list[str] = []
    mode = peering.choose(OperatorConfig(namespaces=("ml",)), lambda path: seen.append(path) or True)
    assert seen == ["/apis/kopf.dev/v1/namespaces/ml/kopfpeerings/kubeinfer"] and not mode.standalone


def write_kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_an_unreachable_api_server_is_one_warning_then_quiet_retries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    server = f"https://127.0.0.1:{free_port()}"
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, server)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube, sleeps = Kube(load_configuration()), []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt   # stands for the person who gives up
    caplog.set_level(logging.DEBUG, logger="kubeinfer")
    with pytest.raises(KeyboardInterrupt):
        preflight.wait_for_api(kube, server, retry_s=10, sleep=sleep)
    # Ours only: urllib3's own retry warnings are quieted by main() (the subprocess test below sees the whole output).
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("kubeinfer")]
    assert warnings == [f"cannot reach the Kubernetes API server at {server} ([Errno 111] Connection refused); "
                        f"retrying every 10 s"]
    assert sleeps == [10, 10, 10]


def test_a_missing_kubeconfig_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(preflight.ClusterUnusable, match="no usable Kubernetes configuration"):
        preflight.load_configuration()


async def test_a_reachable_server_without_our_crd_says_so(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    kmock.resources.load_bundled()      # the built-in resources only: /apis/kubeinfer.dev/... answers 404
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, str(kmock.url).rstrip("/"))))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = Kube(load_configuration())
    reason, served = await asyncio.to_thread(preflight.probe, kube, "kmock")
    assert reason is None and served is False
    await asyncio.to_thread(preflight.wait_for_api, kube, "kmock")
    assert any("CRD (inferenceservices.kubeinfer.dev) is not installed" in r.getMessage() for r in caplog.records)


def run_operator_command(kubeconfig: Path, seconds: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEINFER_")} | {"KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    try:
        return subprocess.run([sys.executable, "-P", "-m", "kubeinfer.operator"], env=env, capture_output=True,
                              text=True, timeout=seconds)
    except subprocess.TimeoutExpired as expired:
        out = (expired.stderr or b"").decode() + (expired.stdout or b"").decode()
        return subprocess.CompletedProcess(expired.cmd, None, "", out)


def test_the_command_says_in_one_line_that_no_cluster_answers(tmp_path: Path) -> None:
    result = run_operator_command(write_kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}"), seconds=6)
    assert result.returncode is None, "it keeps waiting for the server"
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "cannot reach" in line] == [
        line for line in result.stderr.splitlines() if line.strip()], result.stderr
    missing = run_operator_command(tmp_path / "absent", seconds=30)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().count("\n") == 0 and "no usable Kubernetes configuration" in missing.stderr
