"""The adapter step against stand-in runtimes (tests/support/lora_runtime.py), without the API server: which
replicas it asks, what it sends, and how their answers become status.adapters and AdaptersReady."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubeinfer.operator.reconcile.lora import status, sync
from kubeinfer.operator.reconcile.lora.sync import Outcome

from support.lora_runtime import LoraRuntime, serve


def pod(name: str, ip: str | None, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {**({"podIP": ip} if ip else {}),
                                         "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture()
async def two(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[LoraRuntime]]:
    runtimes = [LoraRuntime(folders={"/a/old": 8, "/a/new": 8}), LoraRuntime(folders={"/a/old": 8, "/a/new": 8})]
    async with serve({"127.0.0.1": runtimes[0], "127.0.0.2": runtimes[1]}) as port:
        monkeypatch.setattr(sync, "PORT", port)
        yield runtimes


def test_only_serving_pods_are_asked() -> None:
    pods = [pod("b", "10.0.0.2"), pod("a", "10.0.0.1"), pod("loading", "10.0.0.3", ready=False),
            pod("going", "10.0.0.4", deleting=True), pod("no-ip", None)]
    assert [p["metadata"]["name"] for p in sync.ready_pods(pods)] == ["a", "b"]


async def test_a_changed_uri_reloads_from_the_new_folder_and_strays_are_unloaded(two: list[LoraRuntime]) -> None:
    for r in two:
        r.loaded.update({"sql": "/a/old", "stray": "/a/old"})
    outcomes = await asyncio.to_thread(sync.sync, [pod("p0", "127.0.0.1"), pod("p1", "127.0.0.2")],
                                       {"sql": "/a/new"})
    assert outcomes == [Outcome("p0", "sql", True), Outcome("p1", "sql", True)]
    for r in two:
        assert r.loaded == {"sql": "/a/new"}
        assert r.routes("unload") == [{"lora_name": "stray"}, {"lora_name": "sql"}]
        assert r.routes("load") == [{"lora_name": "sql", "lora_path": "/a/new"}]


async def test_an_unreachable_replica_is_recorded_and_the_others_served(two: list[LoraRuntime]) -> None:
    pods = [pod("p0", "127.0.0.1"), pod("p9", "127.0.0.9")]   # nothing listens on 127.0.0.9
    outcomes = await asyncio.to_thread(sync.sync, pods, {"sql": "/a/new", "x": "/a/none"})
    by_key = {(o.pod, o.adapter): o for o in outcomes}
    assert by_key["p0", "sql"].ready and by_key["p0", "sql"].message == ""
    assert by_key["p0", "x"] == Outcome("p0", "x", False, "no such folder: /a/none")
    assert not by_key["p9", "sql"].ready and by_key["p9", "sql"].message.startswith("cannot reach the runtime: ")
    assert two[0].loaded == {"sql": "/a/new"}


async def test_without_the_key_the_refusal_is_reported(two: list[LoraRuntime]) -> None:
    two[0].key = "sk-1"
    [wrong] = await asyncio.to_thread(sync.sync, [pod("p0", "127.0.0.1")], {"sql": "/a/new"}, "sk-2")
    assert not wrong.ready and "401" in wrong.message
    [right] = await asyncio.to_thread(sync.sync, [pod("p0", "127.0.0.1")], {"sql": "/a/new"}, "sk-1")
    assert right.ready


def test_all_loaded() -> None:
    report = status.report(["sql", "chat"], ["p0", "p1"], [
        Outcome("p1", "sql", True), Outcome("p0", "sql", True), Outcome("p0", "chat", True), Outcome("p1", "chat", True)])
    assert report.condition == {"type": "AdaptersReady", "status": "True", "reason": "AllLoaded",
                                "message": "2 adapters loaded on 2 ready replicas"}
    assert report.entries == [
        {"name": "sql", "readyReplicas": 2, "pods": [{"pod": "p0", "ready": True, "message": ""},
                                                     {"pod": "p1", "ready": True, "message": ""}]},
        {"name": "chat", "readyReplicas": 2, "pods": [{"pod": "p0", "ready": True, "message": ""},
                                                      {"pod": "p1", "ready": True, "message": ""}]}]


def test_a_failure_names_the_adapter_replica_and_the_runtime_s_words() -> None:
    report = status.report(["sql", "wide"], ["p0", "p1"], [
        Outcome("p0", "sql", True), Outcome("p1", "sql", True),
        Outcome("p0", "wide", False, "rank 64 above 16"), Outcome("p1", "wide", False, "rank 64 above 16")])
    assert report.condition is not None
    assert (report.condition["status"], report.condition["reason"]) == ("False", "AdapterFailed")
    assert report.condition["message"] == ("not loaded: wide; adapter wide on p0: rank 64 above 16; "
                                           "adapter wide on p1: rank 64 above 16")
    assert [e["readyReplicas"] for e in report.entries or []] == [2, 0]


def test_no_replica_and_no_adapter() -> None:
    waiting = status.report(["sql"], [], [])
    assert waiting.condition is not None and waiting.condition["status"] == "Unknown"
    assert waiting.entries == [{"name": "sql", "readyReplicas": 0, "pods": []}]
    empty = status.report([], ["p0"], [])
    assert empty.condition is not None and (empty.condition["status"], empty.condition["reason"]) == ("True",
                                                                                                      "NoAdapters")
    assert empty.entries == []


def observe(current: dict[str, Any], adapters: status.AdapterReport | None) -> dict[str, Any]:
    from kubeinfer.operator.reconcile.status import compute_status
    return compute_status(desired=1, selector="s", endpoint="e", generation=1, deployment=None, pods=[],
                          spec_errors=[], current=current, now="2026-01-02T00:00:00Z", adapters=adapters)


def test_the_pass_writes_the_report_and_lora_off_removes_it() -> None:
    report = status.report(["sql"], ["p0"], [Outcome("p0", "sql", False, "no such folder: /x")])
    written = observe({}, report)
    assert written["adapters"] == report.entries
    assert [c["type"] for c in written["conditions"]] == ["Ready", "Progressing", "Degraded", "AdaptersReady"]
    # LoRA turned off: the field goes (a merge patch's null) and so does the condition.
    off = observe(written, status.LORA_OFF)
    assert off["adapters"] is None and "AdaptersReady" not in [c["type"] for c in off["conditions"]]
    # A spec that does not parse: the adapters' fields are left as they are.
    kept = observe(written, None)
    assert "adapters" not in kept and "AdaptersReady" in [c["type"] for c in kept["conditions"]]
