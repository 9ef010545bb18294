"""The node-local model cache, run for real: the download init container's script, as the operator builds it,
run by `sh` with the real `hf` CLI against a stand-in Hub on 127.0.0.1 (tests/support/hub_standin.py).

The cache volume (a node directory) is a local folder: the script's mount point is rewritten to it; each
"replica" is one run of the script with its own HOME, as each pod has its own /tmp. What this does not
exercise: a real node's hostPath mount, the aws CLI (s3:// runs the same script around `aws s3 sync`), and the
real Hub's API beyond what `hf download` asks of the stand-in.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import builders, model_cache
from kubeinfer.operator.reconcile.security import RUN_AS_USER
from kubeinfer.operator.spec import parse_spec

from support.hub_standin import HubStandIn

REPO = "org/model"
URI = f"hf://{REPO}@v1"
HF = Path(sys.executable).with_name("hf")
OWNER = builders.Owner(name="m", namespace="ml", uid="0000")
pytestmark = pytest.mark.skipif(not (HF.exists() and shutil.which("flock")), reason="needs the hf CLI and flock")


def init_script(cache: Path, uri: str = URI) -> str:
    spec = parse_spec({"model": {"uri": uri, "cacheHostPath": "/var/lib/kubeinfer/models"}})
    dep = builders.deployment(spec, OWNER, OperatorConfig())
    [init] = dep["spec"]["template"]["spec"]["initContainers"]
    assert {"name": "model", "mountPath": model_cache.MODEL_MOUNT} in init["volumeMounts"]
    return init["command"][-1].replace(model_cache.MODEL_MOUNT + "/", f"{cache}/")


def replica(script: str, hub: HubStandIn, home: Path, user: list[str] | None = None) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{HF.parent}:/usr/bin:/bin", "HOME": str(home), "HF_ENDPOINT": hub.url,
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.Popen([*(user or []), "sh", "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (folder / "model.safetensors").write_bytes(os.urandom(3 * 2**20))
    return folder


def model_folder(cache: Path, uri: str = URI) -> Path:
    return cache / model_cache.cache_key(uri)


def assert_complete(cache: Path, remote: Path) -> None:
    folder = model_folder(cache)
    for file in remote.iterdir():
        assert (folder / file.name).read_bytes() == file.read_bytes()
    assert (folder / model_cache.DOWNLOAD_COMPLETE).is_file()
    assert not folder.with_name(folder.name + ".partial").exists()


def test_replicas_that_start_together_download_once_and_restarts_reuse_it(tmp_path: Path, remote: Path) -> None:
    cache = tmp_path / "node-cache"
    cache.mkdir()
    script = init_script(cache)
    with HubStandIn(REPO, remote) as hub:
        procs = [replica(script, hub, tmp_path / f"home-{i}") for i in range(3)]
        results = [finish(p) for p in procs]
        assert [rc for rc, _ in results] == [0, 0, 0], results
        assert hub.downloads == {"config.json": 1, "model.safetensors": 1}
        assert_complete(cache, remote)
        # A restarted replica (or a new one on this node) finds the model and asks the Hub for nothing.
        assert finish(replica(script, hub, tmp_path / "home-restart")) == (0, "")
        assert hub.downloads == {"config.json": 1, "model.safetensors": 1}


def test_another_revision_gets_its_own_folder(tmp_path: Path, remote: Path) -> None:
    cache = tmp_path / "node-cache"
    cache.mkdir()
    with HubStandIn(REPO, remote) as hub:
        assert finish(replica(init_script(cache), hub, tmp_path / "a"))[0] == 0
        assert finish(replica(init_script(cache, f"hf://{REPO}@v2"), hub, tmp_path / "b"))[0] == 0
        assert hub.downloads == {"config.json": 2, "model.safetensors": 2}
    assert model_folder(cache) != model_folder(cache, f"hf://{REPO}@v2")
    assert (model_folder(cache, f"hf://{REPO}@v2") / model_cache.DOWNLOAD_COMPLETE).is_file()


def test_a_download_killed_midway_publishes_nothing_and_the_next_replica_finishes_it(tmp_path: Path,
                                                                                     remote: Path) -> None:
    cache = tmp_path / "node-cache"
    cache.mkdir()
    script = init_script(cache)
    with HubStandIn(REPO, remote) as hub:
        hub.stall = "model.safetensors"
        first = replica(script, hub, tmp_path / "home-1")
        waiting = replica(script, hub, tmp_path / "home-2")   # blocked on the lock behind the first
        assert hub.stalled.wait(60)
        os.killpg(first.pid, signal.SIGKILL)   # the pod deleted (or OOM-killed) mid-download
        first.wait()
        assert not model_folder(cache).exists()
        hub.stall = None
        hub.release.set()
        assert finish(waiting)[0] == 0   # the kernel released the dead holder's lock
        assert_complete(cache, remote)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to run as uid 1000")
def test_a_node_directory_the_pods_user_cannot_write_fails_with_one_clear_line(tmp_path: Path,
                                                                              remote: Path) -> None:
    cache = tmp_path / "node-cache"
    cache.mkdir(mode=0o755)   # as the kubelet creates a missing hostPath directory: root's, 0755
    tmp_path.chmod(0o755)
    as_pod_user = ["setpriv", f"--reuid={RUN_AS_USER}", f"--regid={RUN_AS_USER}", "--clear-groups"]
    with HubStandIn(REPO, remote) as hub:
        home = tmp_path / "home"
        home.mkdir()
        shutil.chown(home, RUN_AS_USER, RUN_AS_USER)
        code, err = finish(replica(init_script(cache), hub, home, as_pod_user))
        assert hub.downloads == {}
    assert code == 2
    assert err.strip().splitlines() == [
        f"kubeinfer: error: the model cache {model_cache.MODEL_MOUNT} is not writable by uid {RUN_AS_USER}: give the volume to "
        f"uid {RUN_AS_USER} (a node directory: chown it)"]
