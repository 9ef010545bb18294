"""The runtime image, run as the operator's pods run it (skipped unless KUBEINFER_TEST_IMAGE names an image).

The container's command, arguments, environment, user, read-only root, dropped capabilities and writable
paths are taken from the operator's own Deployment builder for a CPU InferenceService of the baked demo
model, so this checks the image against what the operator really asks of it: /v1/models, a completion and
a stream through the official `openai` client, a SIGTERM drain that lets every stream end and exits 0, and
one-line errors (no traceback) for an unreadable model mount and a read-only HOME.

`make image-test` runs it; KUBEINFER_CONTAINER_ENGINE (podman, or docker) and KUBEINFER_CONTAINER_RUN_FLAGS
(extra `run` flags a host needs, e.g. a runtime or ulimits) adapt it to the machine.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import free_port, streams, wait_for

IMAGE = os.environ.get("KUBEINFER_TEST_IMAGE")
ENGINE = os.environ.get("KUBEINFER_CONTAINER_ENGINE", "podman")
RUN_FLAGS = shlex.split(os.environ.get("KUBEINFER_CONTAINER_RUN_FLAGS", ""))
pytestmark = pytest.mark.skipif(not IMAGE, reason="KUBEINFER_TEST_IMAGE is not set (make image-test sets it)")

SERVED = "demo"
DEMO_URI = "file:///opt/kubeinfer/models/demo"
MAX_TOKENS = 64


def operator_pod(**spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, runtime container) exactly as the operator builds them for this image."""
    from kubeinfer.operator.config import OperatorConfig
    from kubeinfer.operator.reconcile import builders
    from kubeinfer.operator.spec import parse_spec
    raw = {"model": {"uri": DEMO_URI}, "resources": {"gpus": 0, "memory": "2Gi"}, **spec}
    dep = builders.deployment(parse_spec(raw), builders.Owner(SERVED, "default", "uid"),
                              OperatorConfig(runtime_image=IMAGE or ""))
    pod = dep["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def run_flags(pod: dict[str, Any], container: dict[str, Any], *, writable_tmp: bool = True) -> list[str]:
    """`podman run` flags for the pod's security settings, memory limit, env and emptyDir mounts."""
    pod_sc, sc = pod["securityContext"], container["securityContext"]
    flags = ["--user", f"{pod_sc['runAsUser']}:{pod_sc['runAsGroup']}"]
    if sc["readOnlyRootFilesystem"]:
        flags += ["--read-only"] + (["--read-only-tmpfs=false"] if ENGINE == "podman" else [])
    flags += [f"--cap-drop={cap}" for cap in sc["capabilities"]["drop"]]
    if not sc["allowPrivilegeEscalation"]:
        flags += ["--security-opt", "no-new-privileges"]
    if memory := container.get("resources", {}).get("limits", {}).get("memory"):
        flags += ["--memory", memory.replace("Gi", "g").replace("Mi", "m")]
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for m in container["volumeMounts"]:
        if m["name"] in empty_dirs and m["mountPath"] == "/tmp" and writable_tmp:
            flags += ["--tmpfs", "/tmp:rw,mode=1777"]
        elif m["name"] in empty_dirs and m["mountPath"] not in ("/tmp", "/dev/shm"):   # e.g. the compile cache
            flags += ["--tmpfs", f"{m['mountPath']}:rw,mode=1777"]
    for env in container.get("env", []):
        flags += ["-e", f"{env['name']}={env['value']}"]
    return flags


class Container:
    def __init__(self, flags: list[str], command: list[str], args: list[str], port: int | None = None):
        publish = ["-p", f"127.0.0.1:{port}:8000"] if port else []
        entry = "[" + ",".join(f'"{part}"' for part in command) + "]"
        self.id = subprocess.run([ENGINE, "run", "-d", *RUN_FLAGS, *flags, *publish, "--entrypoint", entry, IMAGE,
                                  *args], check=True, capture_output=True, text=True).stdout.strip()
        self.url = f"http://127.0.0.1:{port}" if port else ""

    def logs(self) -> str:
        out = subprocess.run([ENGINE, "logs", self.id], capture_output=True, text=True)
        return out.stdout + out.stderr

    def wait(self, timeout_s: float) -> int:
        return int(subprocess.run([ENGINE, "wait", self.id], check=True, capture_output=True, text=True,
                                  timeout=timeout_s).stdout.strip())

    def signal(self, name: str) -> None:
        subprocess.run([ENGINE, "kill", "--signal", name, self.id], check=True, capture_output=True)

    def remove(self) -> None:
        subprocess.run([ENGINE, "rm", "-f", "-t", "0", self.id], capture_output=True)

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def served() -> Iterator[Container]:
    pod, container = operator_pod(runtime={"drainTimeoutSeconds": 60})
    box = Container(run_flags(pod, container), container["command"], container["args"], port=free_port())
    try:
        started = time.monotonic()
        wait_for(lambda: box.ready() or "exited" in state(box), 120, "the runtime container to be ready", 0.2)
        assert box.ready(), box.logs()
        print(f"container started -> /ready in {time.monotonic() - started:.1f} s")
        yield box
    finally:
        box.remove()


def state(box: Container) -> str:
    return subprocess.run([ENGINE, "inspect", "-f", "{{.State.Status}}", box.id], capture_output=True,
                          text=True).stdout.strip()


def test_lists_the_model_the_operator_names(served: Container) -> None:
    models = streams.client(served.url + "/v1").models.list()
    assert [m.id for m in models.data] == [SERVED]


def test_completion_and_stream_through_the_openai_client(served: Container) -> None:
    api = streams.client(served.url + "/v1")
    whole = api.completions.create(model=SERVED, prompt="Kubernetes is", max_tokens=16, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert whole.usage.completion_tokens == 16 and whole.choices[0].text
    streamed = streams.stream_completion(api, SERVED, "Kubernetes is", 16)
    assert streamed.whole(16), streamed
    assert streamed.text == whole.choices[0].text


def test_sigterm_lets_every_stream_finish_then_exits_zero(served: Container) -> None:
    pool = streams.StreamPool(streams.client(served.url + "/v1"), SERVED, count=4, max_tokens=MAX_TOKENS * 4)
    assert pool.wait_all_started(60), "the streams never started"
    served.signal("TERM")
    time.sleep(0.3)
    assert httpx.get(served.url + "/ready", timeout=5).status_code == 503   # endpoints drop a draining pod
    results = pool.join(120)
    assert pool.cut() == [], [r for r in results if not r.whole(pool.max_tokens)]
    assert served.wait(60) == 0, served.logs()
    assert "drained" in served.logs()


def one_line_failure(flags: list[str], command: list[str], args: list[str]) -> str:
    """Runs a container that must fail: exit code 2, one `kubeinfer: error:` line, no traceback."""
    box = Container(flags, command, args)
    try:
        code, logs = box.wait(120), box.logs()
    finally:
        box.remove()
    assert code == 2, logs
    assert "Traceback" not in logs, logs
    errors = [line for line in logs.splitlines() if line.startswith("kubeinfer: error:")]
    assert len(errors) == 1, logs
    return errors[0]


def test_an_unreadable_model_mount_is_one_line(tmp_path: Path) -> None:
    if os.getuid() == 1000:
        pytest.skip("the host user is uid 1000, as the pod's: a folder it owns stays readable to the pod")
    models = tmp_path / "models"
    (models / "weights").mkdir(parents=True)
    models.chmod(0o700)          # readable by its owner only, not by the pod's uid 1000
    pod, container = operator_pod()
    args = list(container["args"])
    args[args.index("--model") + 1] = "/models/weights"
    line = one_line_failure(run_flags(pod, container) + ["-v", f"{models}:/models:ro"], container["command"], args)
    assert "'/models/weights' cannot be read by uid 1000: permission denied" in line


def test_a_read_only_home_is_one_line() -> None:
    pod, container = operator_pod()
    args = list(container["args"])
    args[args.index("--model") + 1] = "demo"        # built under $HOME/.cache when no baked folder is named
    flags = run_flags(pod, container, writable_tmp=False) + ["-e", "KUBEINFER_DEMO_MODEL_DIR="]
    line = one_line_failure(flags, container["command"], args)
    assert "cannot build the demo model in /tmp/.cache/kubeinfer/demo-model-v1: Read-only file system" in line
