"""`kubectl exec` for the real-cluster tests that act inside a pod (the chaos suite's faults)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def kubectl() -> str:
    """kubectl on the PATH or beside this Python (make e2e installs it there); the test skips without it."""
    found = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("kubectl is not on the PATH (make e2e installs it)")
    return found


def exec_in(ns: str, pod: str, container: str, command: str) -> str:
    """Runs `sh -c command` in the pod's container; its stdout (a failure raises)."""
    return subprocess.run([kubectl(), "exec", "-n", ns, pod, "-c", container, "--", "sh", "-c", command],
                          check=True, timeout=60, capture_output=True, text=True).stdout
