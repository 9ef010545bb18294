"""Where a replica finds its weights: the volume mounted at /models and, for hf:// and s3://, the init
container that downloads them there.

Policy, decided here:
- Downloaded weights (hf://, s3://) go to an emptyDir, or to a shared cache (a node directory or a PVC) in a
  folder named after the URI, so models never mix there. The download takes a file lock beside that
  folder (flock: released by the kernel when its holder dies, so a killed download never wedges the
  next), fills `<folder>.partial` (resumed after a failure) and renames it into place when complete: a
  replica finds either nothing or the whole model, and replicas that start together download it once.
- pvc:// mounts the claim read-only and reads the path inside it; file:// reads weights baked into the image.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile.security import RUN_AS_USER, container_security_context
from kubeinfer.operator.spec import InferenceServiceSpec, ModelSource

MODEL_MOUNT = "/models"
DOWNLOAD_COMPLETE = ".kubeinfer-complete"


def model_dir(model: ModelSource) -> str:
    """The directory `kubeinfer serve --model` reads inside the runtime container."""
    if model.scheme == "file":
        return "/" + model.location.lstrip("/")
    if model.scheme == "pvc":
        _, _, path = model.location.partition("/")
        return f"{MODEL_MOUNT}/{path}".rstrip("/")
    if model.cache_host_path or model.cache_volume_claim:
        return f"{MODEL_MOUNT}/{cache_key(model.uri)}"
    return f"{MODEL_MOUNT}/weights"


def cache_key(uri: str) -> str:
    """The folder of a downloaded model in a shared cache: readable, and unique to the URI (revision included)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", uri.replace("://", "-", 1)).strip("-.")[:80]
    return f"{readable}-{hashlib.sha256(uri.encode()).hexdigest()[:10]}"


def model_volume(model: ModelSource) -> dict[str, Any] | None:
    """The volume mounted at /models, or None for file:// (weights baked into the image)."""
    if model.scheme == "file":
        return None
    if model.scheme == "pvc":
        claim = model.location.split("/", 1)[0]
        return {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    if model.cache_volume_claim:
        return {"name": "model", "persistentVolumeClaim": {"claimName": model.cache_volume_claim}}
    if model.cache_host_path:
        return {"name": "model", "hostPath": {"path": model.cache_host_path, "type": "DirectoryOrCreate"}}
    empty: dict[str, Any] = {}
    if model.cache_size_limit:
        empty["sizeLimit"] = model.cache_size_limit
    return {"name": "model", "emptyDir": empty}


def download_init_container(spec: InferenceServiceSpec, config: OperatorConfig) -> dict[str, Any] | None:
    """An init container that fetches hf:// or s3:// weights into `model_dir` (once per cache)."""
    model = spec.model
    target = model_dir(model)
    fetch = fetch_command(model.uri, f"{target}.partial")
    if fetch is None:
        return None
    image = hf_image(spec, config) if model.scheme == "hf" else config.s3_downloader_image
    container: dict[str, Any] = {
        "name": "model-download",
        "image": image,
        "command": ["sh", "-c", download_script(fetch, target)],
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "model", "mountPath": MODEL_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    if model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": model.credentials_secret}}]
    return container


def fetch_command(uri: str, partial: str) -> str | None:
    """The shell command that downloads an hf:// or s3:// URI into the folder `partial`; None for other schemes."""
    scheme, _, location = uri.partition("://")
    if scheme == "hf":
        repo, _, revision = location.partition("@")
        fetch = f"hf download {shlex.quote(repo)} --local-dir {partial}"
        return fetch + (f" --revision {shlex.quote(revision)}" if revision else "")
    if scheme == "s3":
        return f"aws s3 sync {shlex.quote(uri)} {partial} --only-show-errors"
    return None


def hf_image(spec: InferenceServiceSpec, config: OperatorConfig) -> str:
    """The image that runs `hf download` (the runtime image has it)."""
    return config.hf_downloader_image or spec.runtime.image or config.runtime_image


def download_script(fetch: str, target: str) -> str:
    """The init container's shell script: `fetch` (which writes `<target>.partial`) runs at most once per cache,
    under a file lock, and its folder is renamed to `target` only when complete (policy: module docstring)."""
    done = f"{target}/{DOWNLOAD_COMPLETE}"
    return "\n".join([
        "set -eu",
        f"test -f {done} && exit 0",
        "command -v flock >/dev/null || { echo 'kubeinfer: error: the downloader image has no flock (util-linux)'"
        " >&2; exit 2; }",
        f"( : >>{target}.lock ) 2>/dev/null || {{ echo \"kubeinfer: error: the model cache {MODEL_MOUNT} is"
        f" not writable by uid $(id -u): give the volume to uid {RUN_AS_USER} (a node directory: chown it)\" >&2;"
        " exit 2; }",
        f"exec 9>>{target}.lock",
        "flock 9",
        f"test -f {done} && exit 0   # another replica finished it while this one waited",
        fetch,
        f"touch {target}.partial/{DOWNLOAD_COMPLETE}",
        f"rm -rf {target}",
        f"mv {target}.partial {target}",
    ])

