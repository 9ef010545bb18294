"""Pure builders of what brings adapters into a replica: where each one lives, the ConfigMap that lists them,
the fetcher sidecar, and the runtime's start command.

Policy, decided here:
- The pod template depends on `runtime.lora` only, never on `spec.adapters`: the list travels in the ConfigMap
  `NAME-adapters` (key `fetch.sh`, a shell script this module writes), which the pod mounts. Changing the list
  changes the ConfigMap, not the Deployment, so nothing rolls out.
- hf:// and s3:// adapters are downloaded into the model's download cache under `/models/adapters/<uri key>`
  (the node directory or PVC of model.cacheHostPath / cacheVolumeClaim: once per node or cluster; else the pod's
  emptyDir), with the model's own script (model_cache.download_script: flock, `.partial`, rename when complete),
  so replicas and InferenceServices that share a cache share the adapter. A model on pvc:// or file:// has no
  writable cache: its pods download adapters into an emptyDir at /adapters. pvc:// adapters are read in place on
  the model's claim (/models/<path>), file:// in the image.
- The fetcher is a native sidecar (an init container with restartPolicy Always, Kubernetes 1.29+) that runs
  `fetch.sh` every FETCH_INTERVAL_SECONDS: it downloads what is missing and writes the `--lora-modules` flag of the
  adapters whose folder is complete to LORA_MODULES_FILE. Its startup probe waits for that file, so the runtime
  starts after a first round with every adapter fetched by then (`kubeinfer serve ... $(cat LORA_MODULES_FILE)`).
  Running replicas see a changed list when the kubelet refreshes the mounted ConfigMap (its sync period, about a
  minute); the fetcher's next round rewrites the file, and the runtime, which follows it (`--lora-modules-file`),
  loads and unloads to match. The operator only reads the outcome (reconcile.lora.sync).
- A failed download is retried at most once a minute (a `<folder>.failed` marker), and logged by the fetcher
  (`kubectl logs POD -c adapter-fetch`); the others go on.
"""

from __future__ import annotations

import shlex
from typing import Any

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile.model_cache import (
    DOWNLOAD_COMPLETE, MODEL_MOUNT, cache_key, download_script, fetch_command, hf_image, model_volume,
)
from kubeinfer.operator.reconcile.security import container_security_context
from kubeinfer.operator.spec import Adapter, InferenceServiceSpec, Lora, ModelSource

FETCHER = "adapter-fetch"
LIST_VOLUME = "adapter-list"
LIST_DIR = "/etc/kubeinfer/adapters"
FETCH_SCRIPT = "fetch.sh"
PRIVATE_VOLUME = "adapters"
PRIVATE_ROOT = "/adapters"
LORA_MODULES_FILE = "/tmp/kubeinfer-lora-modules"
FETCH_INTERVAL_SECONDS = 5
RETRY_FAILED_MINUTES = 1
ADAPTER_CONFIG = "adapter_config.json"


def configmap_name(service: str) -> str:
    """The ConfigMap listing the adapters of the InferenceService `service`."""
    return f"{service}-adapters"


def shares_model_cache(model: ModelSource) -> bool:
    """Whether adapters go into the model's own download volume (writable: hf:// and s3:// models)."""
    return model.scheme in ("hf", "s3")


def adapter_root(model: ModelSource) -> str:
    return f"{MODEL_MOUNT}/adapters" if shares_model_cache(model) else PRIVATE_ROOT


def adapter_dir(spec: InferenceServiceSpec, adapter: Adapter) -> str:
    """The folder `lora_path` names inside the runtime container."""
    if adapter.scheme == "file":
        return "/" + adapter.location.lstrip("/")
    if adapter.scheme == "pvc":
        _, _, path = adapter.location.partition("/")
        return f"{MODEL_MOUNT}/{path.strip('/')}"
    return f"{adapter_root(spec.model)}/{cache_key(adapter.uri)}"


def desired_paths(spec: InferenceServiceSpec) -> dict[str, str]:
    """Adapter name -> its folder in the pods, in spec order."""
    return {a.name: adapter_dir(spec, a) for a in spec.adapters}


def runtime_args(lora: Lora) -> list[str]:
    """The runtime's LoRA flags: slots and rank, and the fetcher's list as the file the server follows."""
    args = ["--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_lora_rank),
            "--lora-modules-file", LORA_MODULES_FILE]
    return args + (["--max-cpu-loras", str(lora.max_cpu_loras)] if lora.max_cpu_loras is not None else [])


def runtime_command() -> list[str]:
    """`kubeinfer serve ARGS` plus the `--lora-modules` the fetcher listed (args follow as "$@")."""
    return ["sh", "-c", f'exec kubeinfer serve "$@" $(cat {LORA_MODULES_FILE})', "kubeinfer-serve"]


def _fetch_block(adapter: Adapter, folder: str) -> list[str]:
    fetch = fetch_command(adapter.uri, f"{folder}.partial")
    listed = f'modules="$modules {adapter.name}={folder}"'
    if fetch is None:   # pvc:// and file://: read in place
        check = f"test -f {folder}/{ADAPTER_CONFIG}" if adapter.scheme == "pvc" else "true"
        return [f"# {adapter.name}: {adapter.uri}", f"{check} && {listed}"]
    script = download_script(fetch, folder).replace("\n", "\n  ")
    return [
        f"# {adapter.name}: {adapter.uri}",
        f'if ! test -f {folder}/{DOWNLOAD_COMPLETE} && test -z "$(find {folder}.failed -mmin '
        f'-{RETRY_FAILED_MINUTES} 2>/dev/null)"; then',
        f"  mkdir -p {folder.rsplit('/', 1)[0]}",
        "  if (",
        f"  {script}",
        f"  ) >&2; then rm -f {folder}.failed; else",
        f"    echo {shlex.quote(f'kubeinfer: adapter {adapter.name}: fetching {adapter.uri} failed')} >&2",
        f"    touch {folder}.failed 2>/dev/null || true",
        "  fi",
        "fi",
        f"test -f {folder}/{DOWNLOAD_COMPLETE} && {listed}",
    ]


def fetch_script(spec: InferenceServiceSpec, modules_file: str = LORA_MODULES_FILE) -> str:
    """One round of the fetcher: download what is missing, then list the complete adapters for --lora-modules."""
    lines = ["# The adapters of this InferenceService, written by the kubeinfer operator (reconcile.lora.fetch).",
             'modules=""']
    for adapter in spec.adapters:
        lines += _fetch_block(adapter, adapter_dir(spec, adapter))
    lines += [f'printf "%s\\n" "${{modules:+--lora-modules$modules}}" > {modules_file}.new',
              f"mv {modules_file}.new {modules_file}"]
    return "\n".join(lines) + "\n"


def configmap_data(spec: InferenceServiceSpec) -> dict[str, str]:
    return {FETCH_SCRIPT: fetch_script(spec)}


def fetcher_loop(list_dir: str = LIST_DIR, modules_file: str = LORA_MODULES_FILE) -> str:
    """The sidecar's command: a round every FETCH_INTERVAL_SECONDS (no list yet: no adapters)."""
    return (f"while :; do if test -f {list_dir}/{FETCH_SCRIPT}; then sh {list_dir}/{FETCH_SCRIPT}; "
            f"else : > {modules_file}; fi; sleep {FETCH_INTERVAL_SECONDS}; done")


def volumes(spec: InferenceServiceSpec, service: str) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [{"name": LIST_VOLUME, "configMap": {"name": configmap_name(service),
                                                                      "optional": True}}]
    if not shares_model_cache(spec.model):
        vols.append({"name": PRIVATE_VOLUME, "emptyDir": {}})
    return vols


def runtime_mounts(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The runtime's extra mount (the model's volume is already at /models)."""
    if shares_model_cache(spec.model):
        return []
    return [{"name": PRIVATE_VOLUME, "mountPath": PRIVATE_ROOT, "readOnly": True}]


def fetcher_container(spec: InferenceServiceSpec, config: OperatorConfig) -> dict[str, Any]:
    mounts = [{"name": LIST_VOLUME, "mountPath": LIST_DIR, "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}]
    if shares_model_cache(spec.model):
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT})
    else:   # pvc:// adapters are looked for on the model's claim (file://: no volume)
        if model_volume(spec.model) is not None:
            mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        mounts.append({"name": PRIVATE_VOLUME, "mountPath": PRIVATE_ROOT})
    container: dict[str, Any] = {
        "name": FETCHER,
        "image": hf_image(spec, config),
        "restartPolicy": "Always",
        "command": ["sh", "-c", fetcher_loop()],
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}],
        "startupProbe": {"exec": {"command": ["test", "-f", LORA_MODULES_FILE]}, "periodSeconds": 1,
                         "failureThreshold": spec.runtime.startup_timeout_seconds},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    if spec.model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.model.credentials_secret}}]
    return container
