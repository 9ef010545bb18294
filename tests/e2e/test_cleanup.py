"""The suite's own cleanup, on a real API server: a fixture whose operator never comes up still deletes its
namespace and leaves no process behind (issue 24: a failed run left 6 namespaces, a Prometheus and a router)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import stop_process
from support.cluster import CREATED_NAMESPACES, OperatorProcess, eventually, namespace_scene, start_operator


def test_a_fixture_whose_operator_fails_to_start_leaves_nothing(kube: Any, crds: None, tmp_path: Path) -> None:
    helper: subprocess.Popen | None = None
    operator: OperatorProcess | None = None
    with pytest.raises(AssertionError, match="the operator exited"):
        with namespace_scene(kube) as (ns, stack):
            # A process started before the failure, as a router or Prometheus is in the real fixtures.
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            stack.callback(stop_process, helper)
            operator = OperatorProcess(ns, tmp_path / "operator.log", args=("--service-monitor", "sometimes"))
            start_operator(stack, kube, operator)   # argparse refuses the value: the operator exits 2
    assert helper.poll() is not None, "the helper process is still running"
    assert operator is not None and operator.proc is not None and operator.proc.poll() == 2, operator.output()
    assert ns not in CREATED_NAMESPACES
    eventually(lambda: kube.get(f"/api/v1/namespaces/{ns}") is None
               or kube.get(f"/api/v1/namespaces/{ns}")["status"]["phase"] == "Terminating", 30,
               "the namespace deleted")
