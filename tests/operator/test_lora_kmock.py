"""The running operator bringing LoRA adapters to replicas: kmock stands in for the API server, and a stand-in
runtime per replica (tests/support/lora_runtime.py) on 127.0.0.1 and 127.0.0.2 reports what it serves as the runtime
would (`GET /lora/adapters`). The operator writes the adapters' ConfigMap and reads those reports; the replicas
follow the list themselves, so here `deliver` hands each stand-in the list the ConfigMap's fetch script writes
(what the kubelet's refresh and the fetcher's round do in a pod).

What the pods' fetcher does (download into the cache) is tests/operator/test_lora_fetch.py; here the folders a
runtime "has" are set by the test.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubeinfer.operator.reconcile.builders import HASH_ANNOTATION, INSTANCE_LABEL
from kubeinfer.operator.reconcile.lora import fetch, sync
from kubeinfer.operator.spec import parse_spec

from support.manifests import condition
from support.lora_runtime import LoraRuntime, serve
from support.operator_harness import (NAMESPACE, child_path, isvc_path, kopf_rewrote_its_record,
                                      operator_with_periodic_pass, rbac_checked_requests, write_requests)

NAME = "qwen"
ISVC = isvc_path(NAMESPACE, NAME)
DEPLOYMENT = child_path("Deployment", NAMESPACE, NAME)
CONFIGMAP = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-adapters"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
HOSTS = ("127.0.0.1", "127.0.0.2")
SQL = {"name": "sql", "uri": "hf://org/sql-lora"}
CHAT = {"name": "chat", "uri": "s3://bucket/chat-lora"}
WIDE = {"name": "wide", "uri": "hf://org/rank-64-lora"}


def spec(*adapters: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"model": {"uri": "pvc://models/qwen"}, "runtime": {"lora": {"maxLoras": 2}},
            "adapters": list(adapters), **extra}


def folder(adapter: dict[str, str]) -> str:
    """Where the pods' fetcher puts this adapter, as the operator tells the runtime."""
    parsed = parse_spec(spec(adapter))
    return fetch.adapter_dir(parsed, parsed.adapters[0])


def manifest(body: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-qwen", "generation": 1,
                         "resourceVersion": "1"}, "spec": body}


def replica_pod(i: int, ready: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-{i}", "namespace": NAMESPACE,
                         "labels": {INSTANCE_LABEL: NAME, "app.kubernetes.io/managed-by": "kubeinfer"}},
            "status": {"phase": "Running", "podIP": HOSTS[i],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def entry(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next((a for a in (obj.get("status") or {}).get("adapters") or [] if a["name"] == name), {})


@pytest.fixture()
async def runtimes(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[LoraRuntime]]:
    """One stand-in runtime per replica, each with every adapter's folder fetched (rank 8; `wide` rank 64)."""
    folders = {folder(SQL): 8, folder(CHAT): 8, folder(WIDE): 64}
    found = [LoraRuntime(folders=dict(folders)) for _ in HOSTS]
    async with serve(dict(zip(HOSTS, found))) as port:
        monkeypatch.setattr(sync, "PORT", port)
        yield found


@pytest.fixture()
async def operator(cluster: Any) -> AsyncIterator[Any]:
    async with operator_with_periodic_pass(cluster, ISVC):
        yield cluster


async def deliver(kapi: Any, runtimes: list[LoraRuntime]) -> dict[str, str]:
    """Each stand-in follows the adapters the ConfigMap's fetch script lists (`NAME=FOLDER`, written to the file the
    runtime follows once a folder is complete); returns that list."""
    script = (await kapi.get(CONFIGMAP))["data"]["fetch.sh"]
    listed = dict(re.findall(r'modules="\$modules (\S+?)=(\S+?)"', script))
    for runtime in runtimes:
        runtime.follow(listed)
    return listed


async def started(kapi: Any, body: dict[str, Any], pods: int = 2) -> dict[str, Any]:
    await kapi.create(isvc_path(NAMESPACE), manifest(body))
    dep = await kapi.eventually(DEPLOYMENT, lambda d: True)
    for i in range(pods):
        await kapi.create(PODS, replica_pod(i))
    return dep


async def test_adding_and_removing_adapters_reaches_the_replicas_through_the_list_without_a_rollout(
        operator: Any, kapi: Any, runtimes: list[LoraRuntime]) -> None:
    before = await started(kapi, spec(SQL))
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "AdaptersReady").get("reason") == "AdapterFailed")
    assert entry(obj, "sql")["pods"][0]["message"].startswith("not loaded yet: the replica loads it once")
    assert await deliver(kapi, runtimes) == {"sql": folder(SQL)}
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "AdaptersReady").get("reason") == "AllLoaded")
    assert condition(obj, "AdaptersReady")["status"] == "True"
    assert entry(obj, "sql")["pods"] == [{"pod": f"{NAME}-0", "ready": True, "message": ""},
                                         {"pod": f"{NAME}-1", "ready": True, "message": ""}]

    await kapi.patch(ISVC, {"metadata": {"generation": 2}, "spec": {"adapters": [SQL, CHAT]}})
    await kapi.eventually(CONFIGMAP, lambda c: CHAT["uri"] in c["data"]["fetch.sh"])
    # each replica pod is told the new list's hash: the pod update makes the kubelet refresh its mounted list now
    wanted = sync.list_hash({"sql": folder(SQL), "chat": folder(CHAT)})
    for i in range(2):
        await kapi.eventually(f"{PODS}/{NAME}-{i}", lambda p: p["metadata"].get("annotations", {}).get(
            sync.LIST_ANNOTATION) == wanted)
    assert await deliver(kapi, runtimes) == {"sql": folder(SQL), "chat": folder(CHAT)}
    await kapi.eventually(ISVC, lambda o: entry(o, "chat").get("readyReplicas") == 2)

    await kapi.patch(ISVC, {"metadata": {"generation": 3}, "spec": {"adapters": [CHAT]}})
    await kapi.eventually(CONFIGMAP, lambda c: SQL["uri"] not in c["data"]["fetch.sh"])
    assert await deliver(kapi, runtimes) == {"chat": folder(CHAT)}
    obj = await kapi.eventually(ISVC, lambda o: [a["name"] for a in o["status"]["adapters"]] == ["chat"]
                                and condition(o, "AdaptersReady").get("reason") == "AllLoaded")
    # The operator only read the replicas' reports, without a key: no load, no unload, no Secret.
    for runtime in runtimes:
        assert {route for route, _ in runtime.calls} == {"adapters"}

    # Three adapter lists, one pod template: the Deployment was never rewritten.
    after = await kapi.get(DEPLOYMENT)
    assert after["metadata"]["annotations"][HASH_ANNOTATION] == before["metadata"]["annotations"][HASH_ANNOTATION]
    assert after["spec"]["template"] == before["spec"]["template"]
    assert not [r for r in write_requests(operator) if r.resource is not None and r.resource.plural == "deployments"
                and r.name == NAME][1:], "the Deployment was written after its creation"
    rbac_checked_requests(operator)


async def test_a_refused_adapter_is_named_and_the_others_keep_serving(
        operator: Any, kapi: Any, runtimes: list[LoraRuntime]) -> None:
    await started(kapi, spec(SQL, WIDE))
    await deliver(kapi, runtimes)
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "AdaptersReady").get("status") == "False"
                                and entry(o, "sql").get("readyReplicas") == 2)
    cond = condition(obj, "AdaptersReady")
    assert cond["reason"] == "AdapterFailed"
    rank = "adapter 'wide' has rank 64, above this server's --max-lora-rank 16"
    assert cond["message"].startswith(f"not loaded: wide; adapter wide on qwen-0: {rank}")
    assert entry(obj, "wide")["readyReplicas"] == 0
    assert {p["message"] for p in entry(obj, "wide")["pods"]} == {rank}

    # The runtime tries a refused adapter again: once the folder holds a fitting one, the status follows.
    for r in runtimes:
        r.folders[folder(WIDE)] = 16
    await deliver(kapi, runtimes)
    obj = await kapi.eventually(ISVC, lambda o: condition(o, "AdaptersReady").get("status") == "True")
    assert entry(obj, "wide")["readyReplicas"] == 2


async def test_only_ready_replicas_are_asked(operator: Any, kapi: Any, runtimes: list[LoraRuntime]) -> None:
    await started(kapi, spec(SQL, CHAT), pods=0)
    await kapi.create(PODS, replica_pod(0))
    await kapi.create(PODS, replica_pod(1, ready=False))   # loading its model: not listening yet
    await kapi.eventually(CONFIGMAP, lambda c: True)
    await deliver(kapi, runtimes)
    await kapi.eventually(ISVC, lambda o: entry(o, "chat").get("readyReplicas") == 1)
    await passes(runtimes[0], 2)   # two periodic passes, counted on the ready replica, not guessed in seconds
    assert runtimes[1].calls == []
    await kapi.patch(f"{PODS}/{NAME}-1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    await kapi.eventually(ISVC, lambda o: entry(o, "chat").get("readyReplicas") == 2)


async def test_a_settled_service_writes_nothing_on_its_periodic_passes(
        operator: Any, kapi: Any, runtimes: list[LoraRuntime]) -> None:
    await started(kapi, spec(SQL))
    await kapi.eventually(CONFIGMAP, lambda c: True)
    await deliver(kapi, runtimes)
    await kapi.eventually(ISVC, lambda o: condition(o, "AdaptersReady").get("status") == "True")
    # kopf's own last patch of the creation (its record of the handled spec) may come after the status on a busy box.
    await kapi.eventually(ISVC, lambda o: "kubeinfer.dev/last-handled-configuration"
                          in ((o.get("metadata") or {}).get("annotations") or {}))
    # Settled: three periodic passes (each asks the replica for its adapters) with no write among them. Counted in
    # passes, not seconds: on a busy box a pass, and kopf's own last patch of the creation, can take longer.
    for _ in range(20):
        writes = len(write_requests(operator))
        await passes(runtimes[0], 3)
        if len(write_requests(operator)) == writes:
            break
    else:
        raise AssertionError(f"the operator kept writing: {write_requests(operator)[-3:]}")
    start = len(list(operator))
    await passes(runtimes[0], 4)
    # kopf storing its unchanged record again is kmock's missing resourceVersion (see the helper), and may come late
    # on a busy box (CI saw it after three quiet passes); anything else is a write of ours.
    obj = await kapi.get(ISVC)
    assert [(r.method, r.url.path, r.data) for r in write_requests(operator, start)
            if not kopf_rewrote_its_record(r, obj)] == []


async def passes(runtime: LoraRuntime, count: int, timeout: float = 30) -> None:
    """Waits until the operator's periodic passes have asked `runtime` for its adapters `count` more times."""
    target = len(runtime.routes("adapters")) + count
    deadline = asyncio.get_running_loop().time() + timeout
    while len(runtime.routes("adapters")) < target:
        assert asyncio.get_running_loop().time() < deadline, f"fewer than {count} periodic passes in {timeout} s"
        await asyncio.sleep(0.05)


async def test_a_service_naming_an_api_keys_secret_is_reported_without_reading_it(
        operator: Any, kapi: Any, runtimes: list[LoraRuntime]) -> None:
    """Least privilege (issue #56): the replicas' reports need no key, so the operator reads no Secret (and has
    no RBAC rule to: rbac_checked_requests fails on any request the ClusterRole does not allow)."""
    keys = "# keys of the team\nsk-first  50000 tenant=a\nsk-second\n"
    await kapi.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": NAMESPACE},
        "data": {"api-keys": base64.b64encode(keys.encode()).decode()}})
    await started(kapi, spec(SQL, apiKeySecretRef={"name": "keys"}))
    await kapi.eventually(CONFIGMAP, lambda c: True)
    await deliver(kapi, runtimes)
    await kapi.eventually(ISVC, lambda o: entry(o, "sql").get("readyReplicas") == 2)
    assert not [r for r in operator if "/secrets" in r.url.path and r.method == "GET"], "the operator read a Secret"
    rbac_checked_requests(operator)
