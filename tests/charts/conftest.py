"""Fixtures of the chart tests: the Helm-subset renderer, loaded by path (tests run with --import-mode=importlib)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeinfer"


def _load(module_name: str, path: Path):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


helm_subset = _load("kubeinfer_chart_helm_subset", Path(__file__).with_name("helm_subset.py"))


@pytest.fixture()
def chart_dir() -> Path:
    return CHART
