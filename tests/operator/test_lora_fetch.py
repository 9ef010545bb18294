"""Adapters into a replica: the pod template that does not depend on the adapter list, where each adapter lives,
and the fetcher run for real: the ConfigMap's script, as the operator writes it, run by `sh` with the real `hf` CLI
against a stand-in Hub on 127.0.0.1 (tests/support/hub_standin.py); then the runtime's start command, with a
stand-in `kubeinfer` that prints its arguments.

The cache (a node directory) is a local folder: the script's mount point is rewritten to it, as in
tests/operator/test_model_cache.py. Not exercised here: the kubelet refreshing a mounted ConfigMap, s3:// (the same
script around `aws s3 sync`), a native sidecar's start order (tests/e2e on a real node).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import builders, model_cache
from kubeinfer.operator.reconcile.lora import fetch
from kubeinfer.operator.spec import parse_spec

from support.hub_standin import HubStandIn

OWNER = builders.Owner(name="m", namespace="ml", uid="0000")
HF = Path(sys.executable).with_name("hf")
GOOD = {"name": "sql", "uri": "hf://org/sql-lora@v1"}
MISSING = {"name": "gone", "uri": "hf://org/no-such-lora"}
BAKED = {"name": "baked", "uri": "file:///opt/kubeinfer/adapters/baked"}
CACHED_MODEL = {"uri": "hf://org/base", "cacheHostPath": "/var/lib/kubeinfer/models"}


def spec(*adapters: dict[str, str], model: dict[str, Any] | None = None) -> Any:
    return parse_spec({"model": model or CACHED_MODEL, "runtime": {"lora": {}}, "adapters": list(adapters)})


def children(parsed: Any) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in builders.children(parsed, OWNER, OperatorConfig(), with_service_monitor=False)}


def test_the_adapter_list_changes_the_configmap_and_never_the_pod_template() -> None:
    lists = [(), (GOOD,), (GOOD, MISSING, BAKED)]
    built = [children(spec(*adapters)) for adapters in lists]
    templates = {repr(b["Deployment"]["spec"]["template"]) for b in built}
    hashes = {b["Deployment"]["metadata"]["annotations"][builders.HASH_ANNOTATION] for b in built}
    assert len(templates) == 1 and len(hashes) == 1
    scripts = [b["ConfigMap"]["data"][fetch.FETCH_SCRIPT] for b in built]
    assert len(set(scripts)) == 3
    assert GOOD["uri"] not in scripts[0] and GOOD["uri"] in scripts[1]
    assert built[0]["ConfigMap"]["metadata"]["name"] == "m-adapters"
    assert "ConfigMap" not in children(parse_spec({"model": CACHED_MODEL}))   # LoRA off: no list


@pytest.mark.parametrize("model, adapter, folder", [
    (CACHED_MODEL, GOOD, f"/models/adapters/{model_cache.cache_key(GOOD['uri'])}"),
    ({"uri": "hf://org/base"}, GOOD, f"/models/adapters/{model_cache.cache_key(GOOD['uri'])}"),
    ({"uri": "pvc://models/base"}, GOOD, f"/adapters/{model_cache.cache_key(GOOD['uri'])}"),
    ({"uri": "pvc://models/base"}, {"name": "p", "uri": "pvc://models/loras/p/"}, "/models/loras/p"),
    ({"uri": "file:///opt/m"}, BAKED, "/opt/kubeinfer/adapters/baked"),
])
def test_each_adapter_has_its_folder(model: dict[str, Any], adapter: dict[str, str], folder: str) -> None:
    parsed = spec(adapter, model=model)
    assert fetch.adapter_dir(parsed, parsed.adapters[0]) == folder


def pod_of(model: dict[str, Any]) -> dict[str, Any]:
    return children(spec(GOOD, model=model))["Deployment"]["spec"]["template"]["spec"]


def test_the_fetcher_is_a_native_sidecar_after_the_model_download() -> None:
    pod = pod_of(CACHED_MODEL)
    assert [c["name"] for c in pod["initContainers"]] == ["model-download", fetch.FETCHER]
    fetcher = pod["initContainers"][1]
    assert fetcher["restartPolicy"] == "Always"
    assert fetcher["startupProbe"]["exec"]["command"] == ["test", "-f", fetch.LORA_MODULES_FILE]
    assert {m["name"]: m.get("readOnly", False) for m in fetcher["volumeMounts"]} == {
        fetch.LIST_VOLUME: True, "tmp": False, "model": False}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[fetch.LIST_VOLUME]["configMap"] == {"name": "m-adapters", "optional": True}
    runtime = pod["containers"][0]
    assert runtime["command"] == fetch.runtime_command()
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in runtime["volumeMounts"]


def test_a_model_without_a_download_cache_gets_a_private_adapter_folder() -> None:
    pod = pod_of({"uri": "pvc://models/base"})
    [fetcher] = pod["initContainers"]
    assert {m["name"]: m.get("readOnly", False) for m in fetcher["volumeMounts"]} == {
        fetch.LIST_VOLUME: True, "tmp": False, "model": True, fetch.PRIVATE_VOLUME: False}
    assert {"name": fetch.PRIVATE_VOLUME, "mountPath": "/adapters", "readOnly": True} in \
        pod["containers"][0]["volumeMounts"]
    assert {"name": fetch.PRIVATE_VOLUME, "emptyDir": {}} in pod["volumes"]


needs_hf = pytest.mark.skipif(not (HF.exists() and shutil.which("flock")), reason="needs the hf CLI and flock")


def local_script(text: str, cache: Path, tmp: Path) -> str:
    return text.replace("/models/", f"{cache}/").replace(fetch.LORA_MODULES_FILE, str(tmp / "lora-modules"))


def run(script: str, hub: HubStandIn, home: Path, path: str = "") -> subprocess.CompletedProcess[str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{path}{HF.parent}:/usr/bin:/bin", "HOME": str(home), "HF_ENDPOINT": hub.url,
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(2**16))
    return folder


@needs_hf
def test_a_fetch_round_downloads_lists_what_is_complete_and_leaves_a_failed_one_out(tmp_path: Path,
                                                                                    remote: Path) -> None:
    cache, tmp = tmp_path / "node-cache", tmp_path / "pod-tmp"
    cache.mkdir()
    tmp.mkdir()
    parsed = spec(GOOD, MISSING, BAKED)
    script = local_script(fetch.fetch_script(parsed), cache, tmp)
    good = cache / "adapters" / model_cache.cache_key(GOOD["uri"])
    with HubStandIn("org/sql-lora", remote) as hub:
        first = run(script, hub, tmp_path / "home")
        assert first.returncode == 0, first.stderr
        assert hub.downloads == {"adapter_config.json": 1, "adapter_model.safetensors": 1}
        assert (good / "adapter_model.safetensors").read_bytes() == (remote / "adapter_model.safetensors").read_bytes()
        listed = f"--lora-modules sql={good} baked=/opt/kubeinfer/adapters/baked\n"
        assert (tmp / "lora-modules").read_text() == listed
        assert "kubeinfer: adapter gone: fetching hf://org/no-such-lora failed" in first.stderr
        # The next round (every few seconds): nothing downloaded again, the failed one not retried within a minute.
        second = run(script, hub, tmp_path / "home")
        assert second.returncode == 0 and second.stderr == ""
        assert hub.downloads == {"adapter_config.json": 1, "adapter_model.safetensors": 1}
        assert (tmp / "lora-modules").read_text() == listed


@needs_hf
def test_the_runtime_starts_with_the_listed_adapters(tmp_path: Path, remote: Path) -> None:
    cache, tmp, bin_dir = tmp_path / "node-cache", tmp_path / "pod-tmp", tmp_path / "bin"
    for folder in (cache, tmp, bin_dir):
        folder.mkdir()
    (bin_dir / "kubeinfer").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "kubeinfer").chmod(0o755)
    list_dir = tmp_path / "list"
    list_dir.mkdir()
    modules = str(tmp / "lora-modules")
    # A round with no list yet (the ConfigMap not made): no adapters, and the runtime starts all the same.
    loop = fetch.fetcher_loop(str(list_dir), modules).replace("while :; do", "for round in 1; do")
    with HubStandIn("org/sql-lora", remote) as hub:
        assert run(loop, hub, tmp_path / "home").returncode == 0
        assert Path(modules).read_text() == ""
        (list_dir / fetch.FETCH_SCRIPT).write_text(local_script(fetch.fetch_script(spec(GOOD)), cache, tmp))
        assert run(loop.replace("sleep 5", "true"), hub, tmp_path / "home").returncode == 0
        sh, c, command, name = [part.replace(fetch.LORA_MODULES_FILE, modules) for part in fetch.runtime_command()]
        started = subprocess.run([sh, c, command, name, "--model", "/models/base"], capture_output=True, text=True,
                                 env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)
    good = cache / "adapters" / model_cache.cache_key(GOOD["uri"])
    assert started.stdout.splitlines() == ["serve", "--model", "/models/base", "--lora-modules", f"sql={good}"]
