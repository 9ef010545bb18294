"""Fixtures of the chaos suite (`make chaos`; docs/e2e.md, "Chaos suite"); its scene and step are
tests/support/chaos_scene.py. The fixtures of tests/e2e apply here (the cluster, the runtime image).

Every test here is marked `chaos`: `make test` and `make e2e` leave them out (`-m "not chaos"`). The chaos table
is printed at the end of the run and written as JSON to KUBEINFER_CHAOS_REPORT when that is set.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.chaos_scene import RECOVERY_LIMIT_S, ROWS, SPEC, Scene, create_service
from support.cluster import OperatorProcess, eventually, namespace_scene, start_operator


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("chaos table")
    columns = ("fault", "sent", "completed", "resumed", "retried", "failed", "lost", "differs", "recovery_s",
               "bound_s")
    terminalreporter.write_line(" | ".join(columns))
    for row in ROWS:
        terminalreporter.write_line(" | ".join(str(row[c]) for c in columns))
    if report := os.environ.get("KUBEINFER_CHAOS_REPORT"):
        Path(report).write_text(json.dumps(ROWS, indent=2))


@pytest.fixture(scope="module")
def scene(kube: Any, crds: None, pod_to_pod: None, runtime_image: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    work: Path = tmp_path_factory.mktemp("chaos")
    with namespace_scene(kube) as (ns, stack):
        operator = start_operator(stack, kube, OperatorProcess(ns, work / "operator.log", image=runtime_image))
        create_service(kube, ns, SPEC)
        scene = Scene(kube, ns, operator)
        eventually(scene.serving, RECOVERY_LIMIT_S, "the chaos service serving at its replica count", 1)
        yield scene


