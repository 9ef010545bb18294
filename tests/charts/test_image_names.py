"""One name per image, everywhere: `make image` tags exactly the names the chart's defaults, the examples, the
Containerfile's build lines and the docs use (ghcr.io/kubeinfer/operator:V, ghcr.io/kubeinfer/runtime:V for
GPU and ghcr.io/kubeinfer/runtime:V-cpu)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kubeinfer import __version__
from kubeinfer.operator.config import DEFAULT_RUNTIME_IMAGE

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = f"ghcr.io/kubeinfer/operator:{__version__}"
RUNTIME_GPU = f"ghcr.io/kubeinfer/runtime:{__version__}"
RUNTIME_CPU = f"ghcr.io/kubeinfer/runtime:{__version__}-cpu"
NAMES = {OPERATOR, RUNTIME_GPU, RUNTIME_CPU}
# Any image reference of this project's: a registry path ending in kubeinfer/<name>:<tag>.
REFERENCE = re.compile(r"\w[\w.-]*(?:/[\w.-]+)*/kubeinfer/[\w.-]+:[\w.-]+")
# Records of past runs name the images they ran (issue branches' tags): docs/benchmarks/ (the notebook) and
# docs/gpu-logs/ are not read (docs/*.md only); docs/benchmarks.md, the current results, is.
# An image that cannot exist is a test's.
NOT_IMAGES = {"localhost/kubeinfer/no-such-image:0", "localhost/kubeinfer/debian:bookworm"}


def make_images(*args: str) -> str:
    """`make -n` of an image target: the names the build would tag."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout
    return " ".join(re.findall(r"\bIMAGE=(\S+)", out))


@pytest.mark.skipif(shutil.which("make") is None, reason="make not found")
def test_make_image_tags_the_documented_names() -> None:
    assert make_images("image") == f"{OPERATOR} {RUNTIME_CPU}"
    assert make_images("image-runtime", "IMAGE_VARIANT=gpu") == RUNTIME_GPU


def test_chart_defaults_and_operator_default_are_those_names() -> None:
    values = yaml.safe_load((ROOT / "charts" / "kubeinfer" / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{values['image']['tag']}" == OPERATOR
    assert values["runtimeImage"] == DEFAULT_RUNTIME_IMAGE == RUNTIME_GPU


def test_examples_name_a_runtime_image_of_their_kind() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec") or {}
            image = (spec.get("runtime") or {}).get("image")
            on_cpu = (spec.get("resources") or {}).get("gpus") == 0
            if image is not None:
                assert image == (RUNTIME_CPU if on_cpu else RUNTIME_GPU), f"{path.name}: {image}"
            else:
                assert not on_cpu, f"{path.name}: a CPU service must name the CPU image (the default is the GPU one)"


def test_every_image_reference_in_docs_and_build_files_is_one_of_the_names() -> None:
    files = [ROOT / "README.md", ROOT / "Containerfile", ROOT / "Makefile", *ROOT.glob(".ci/*"),
             *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.yaml"),
             *(ROOT / "charts" / "kubeinfer").rglob("*.txt"), *(ROOT / "charts" / "kubeinfer").glob("*.md"),
             *(ROOT / "charts" / "kubeinfer").glob("values.yaml")]
    seen: dict[str, set[str]] = {}
    for path in files:
        if not path.is_file():
            continue
        for ref in REFERENCE.findall(path.read_text()):
            seen.setdefault(ref, set()).add(str(path.relative_to(ROOT)))
    strays = {ref: where for ref, where in seen.items() if ref not in NAMES | NOT_IMAGES}
    assert not strays, f"image names that are none of {sorted(NAMES)}: {strays}"
    assert NAMES <= set(seen), f"never documented: {NAMES - set(seen)}"
