"""The cold start learned from pods (`autoscaling.cold_start`): what counts as an observation, the median,
the watermark, and the round trip through status."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.autoscaling.signals.cold_start import MAX_SAMPLES, ColdStartRecord, ColdStartSample, observe_pod
from kubeinfer.operator.times import rfc3339 as iso

T0 = 1_800_000_000.0


def pod(name: str, created: float, ready_at: float | None, restarts: int = 0, ready: bool = True,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": iso(created)}
    if deleting:
        meta["deletionTimestamp"] = iso(ready_at or created)
    cond: dict[str, Any] = {"type": "Ready", "status": "True" if ready else "False"}
    if ready_at is not None:
        cond["lastTransitionTime"] = iso(ready_at)
    return {"metadata": meta, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}, cond],
                                         "containerStatuses": [{"name": "runtime", "restartCount": restarts}]}}


def test_a_ready_pod_is_observed_from_creation_to_its_ready_transition():
    sample = observe_pod(pod("a", T0, T0 + 42))
    assert sample == ColdStartSample("a", T0, T0 + 42) and sample.seconds == 42


def test_unready_restarted_deleting_or_undated_pods_are_not_observations():
    assert observe_pod(pod("a", T0, T0 + 42, ready=False)) is None
    assert observe_pod(pod("b", T0, T0 + 42, restarts=1)) is None  # Ready after a crash, not a cold start
    assert observe_pod(pod("c", T0, T0 + 42, deleting=True)) is None
    assert observe_pod(pod("d", T0, None)) is None
    assert observe_pod({"metadata": {"name": "e"}, "status": {}}) is None


def test_the_learned_cold_start_is_the_median_which_one_slow_pod_hardly_moves():
    assert ColdStartRecord().seconds is None
    record = ColdStartRecord().with_pods([pod("a", T0, T0 + 30), pod("b", T0, T0 + 40), pod("c", T0, T0 + 600)])
    assert record.seconds == 40
    assert [s.pod for s in record.samples] == ["a", "b", "c"]  # oldest Ready first


def test_pods_are_counted_once_and_only_the_last_samples_are_kept():
    record = ColdStartRecord().with_pods([pod("a", T0, T0 + 30)])
    assert record.with_pods([pod("a", T0, T0 + 30)]) is record  # seen again: nothing new
    many = [pod(f"p{i}", T0 + 100 * i, T0 + 100 * i + 20) for i in range(1, MAX_SAMPLES + 3)]
    record = record.with_pods(many)
    assert len(record.samples) == MAX_SAMPLES and record.samples[0].pod == "p3" and record.seconds == 20
    # "a" left the record; it became Ready before the newest kept sample, so it is not counted again
    assert record.with_pods([pod("a", T0, T0 + 30)]) is record
    # a new pod that became Ready later is
    assert record.with_pods([pod("new", T0 + 5000, T0 + 5090)]).samples[-1].pod == "new"


def test_the_record_round_trips_through_status():
    record = ColdStartRecord().with_samples([ColdStartSample("a", T0, T0 + 30.5), ColdStartSample("b", T0 + 10, T0 + 50)])
    status = record.to_status()
    assert status["coldStartSeconds"] == 35.25
    assert status["coldStartSamples"][0] == {"pod": "a", "createdAt": "2027-01-15T08:00:00Z",
                                             "readyAt": "2027-01-15T08:00:30.5Z", "seconds": 30.5}
    assert ColdStartRecord.from_status(status) == record
    assert ColdStartRecord.from_status(None) == ColdStartRecord() == ColdStartRecord.from_status(
        {"coldStartSamples": [{"pod": "x"}]})
    assert ColdStartRecord().to_status() == {"coldStartSeconds": None, "coldStartSamples": []}
