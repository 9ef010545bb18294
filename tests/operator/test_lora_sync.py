"""The adapter step against stand-in runtimes (tests/support/lora_runtime.py), without the API server: which
replicas it asks, what it sends, and how their answers become status.adapters and AdaptersReady."""

from __future__ import annotations

import asyncio
import dataclasses
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
    runtimes = [LoraRuntime(folders={"/a/old": 8, "/a/new": 8, "/a/wide": 64}) for _ in range(2)]
    async with serve({"127.0.0.1": runtimes[0], "127.0.0.2": runtimes[1]}) as port:
        monkeypatch.setattr(sync, "PORT", port)
        yield runtimes


def test_only_serving_pods_are_asked() -> None:
    pods = [pod("b", "10.0.0.2"), pod("a", "10.0.0.1"), pod("loading", "10.0.0.3", ready=False),
            pod("going", "10.0.0.4", deleting=True), pod("no-ip", None)]
    assert [p["metadata"]["name"] for p in sync.ready_pods(pods)] == ["a", "b"]


async def test_each_replica_s_report_becomes_one_outcome_per_adapter_with_no_key_and_no_write(
        two: list[LoraRuntime]) -> None:
    """Loaded from the spec's folder: ready. Still from the old folder (its URI changed, the list not yet
    refreshed), not listed yet, or refused: not ready, saying which. Only GET /lora/adapters, without a key."""
    two[0].follow({"sql": "/a/new", "chat": "/a/old", "wide": "/a/wide"})
    two[1].follow({"sql": "/a/new"})
    desired = {"sql": "/a/new", "chat": "/a/new", "wide": "/a/wide"}
    outcomes = await asyncio.to_thread(sync.sync, [pod("p0", "127.0.0.1"), pod("p1", "127.0.0.2")], desired)
    by_key = {(o.pod, o.adapter): o for o in outcomes}
    assert len(outcomes) == 6
    assert by_key["p0", "sql"] == Outcome("p0", "sql", True) == dataclasses.replace(by_key["p1", "sql"], pod="p0")
    assert by_key["p0", "chat"].message.startswith("still served from /a/old, not /a/new: the replica loads it")
    assert by_key["p1", "chat"].message.startswith("not loaded yet: the replica loads it once its adapters list")
    assert by_key["p0", "wide"] == Outcome("p0", "wide", False,
                                           "adapter 'wide' has rank 64, above this server's --max-lora-rank 16")
    for runtime in two:
        assert [route for route, _ in runtime.calls] == ["adapters"]
        assert "Authorization" not in runtime.calls[0][1]


async def test_an_unreachable_replica_is_recorded_and_the_others_read(two: list[LoraRuntime]) -> None:
    two[0].follow({"sql": "/a/new"})
    pods = [pod("p0", "127.0.0.1"), pod("p9", "127.0.0.9")]   # nothing listens on 127.0.0.9
    outcomes = await asyncio.to_thread(sync.sync, pods, {"sql": "/a/new"})
    by_key = {(o.pod, o.adapter): o for o in outcomes}
    assert by_key["p0", "sql"].ready
    assert not by_key["p9", "sql"].ready and by_key["p9", "sql"].message.startswith("cannot reach the runtime: ")


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
