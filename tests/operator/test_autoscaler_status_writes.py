"""The autoscaler writes status only when what a reader or a restarted operator needs has changed, and a
restarted operator decides as the uninterrupted one does (`history_status`, `policy._record`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeinfer.operator.autoscaling.history_status import history_for, history_status, is_quiet
from kubeinfer.operator.autoscaling.policies.types import ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import Signals

from support.autoscaler_loop import T0, desired, idle, run, service


def busy(queue: float, running: float, rate: float):
    return lambda now: Signals(now, queue_depth=queue, num_running=running, request_rate=rate, num_pods_reporting=2)


# Idle, a burst the queue rule answers, the load going down in steps (the scale-down window holding each
# step), idle again until the fleet is back at its floor.
SCRIPT = ([idle] * 20 + [busy(30, 8, 3.0)] * 3 + [busy(12, 16, 6.0)] * 4 + [busy(0, 12, 4.0)] * 10
          + [busy(0, 6, 2.0)] * 20 + [idle] * 60)


def test_an_idle_service_makes_no_status_write_once_settled():
    stored = service(replicas=2, minReplicas=2)
    plans, writes = run(stored, [idle] * 100)
    sizes = desired(plans)
    assert set(sizes) == {2}
    # the first pass writes the history, the next ones fill the first queue window (30 s), then nothing changes
    assert writes[0] == 1 and sum(writes[7:]) == 0, writes
    st = stored.body["status"]
    assert st["lastSignals"] == {"queueDepth": 0.0, "numRunning": 0.0, "requestRate": 0.0, "numPodsReporting": 2,
                                 "recommendation": 2, "reason": "WithinTolerance"}
    assert st["scalingHistory"]["recommendations"] == [["2027-01-15T08:00:00Z", 2, 0]]


def test_an_idle_service_writes_its_scale_down_then_nothing():
    stored = service(replicas=3)
    plans, writes = run(stored, [idle] * 100)
    sizes = desired(plans)
    # a fresh history waits one scale-down window (60 s = 12 passes), then steps down one at a time
    assert sizes[:13] == [3] * 12 + [2] and sizes[-1] == 1
    # a scale writes its event; then the window's samples, with each ready count in them, until the window
    # (30 s: the samples of 7 passes) has only the new count; then nothing
    scaled = sizes.index(1)
    assert all(writes[scaled:scaled + 7]) and sum(writes[scaled + 7:]) == 0, writes
    # the first pass starts the idle clock (a fresh history counts it as traffic), the second says it stopped;
    # the rest of the scale-down window writes nothing
    assert sum(writes[2:12]) == 0, writes


def test_a_restart_at_any_pass_decides_as_the_uninterrupted_operator():
    straight = desired(run(service(replicas=2), SCRIPT)[0])
    assert max(straight) == 8 and straight[-1] == 1, straight  # the script scales up, then down to the floor
    assert straight[28:31] == [8, 7, 7]
    for k in range(1, len(SCRIPT)):
        resumed = desired(run(service(replicas=2), SCRIPT, restart_at=k)[0])
        assert resumed == straight, f"restart before pass {k}"


@pytest.mark.slow   # 12 s; the default run keeps the same check without the scale-up window
def test_a_restart_with_a_scale_up_window_decides_as_the_uninterrupted_operator():
    straight = desired(run(service(replicas=2, scaleUpStabilizationSeconds=10), SCRIPT)[0])
    assert straight[20:23] == [1, 1, 4], straight   # the burst waits two passes for the window
    for k in range(1, len(SCRIPT)):
        resumed = desired(run(service(replicas=2, scaleUpStabilizationSeconds=10), SCRIPT, restart_at=k)[0])
        assert resumed == straight, f"restart before pass {k}"


def test_a_restart_from_status_alone_after_an_idle_hour_decides_as_the_uninterrupted_operator():
    """The quiet window's samples were not rewritten; the restarted operator's window is shorter, and its
    decisions are the same through a burst and the scale-down after it."""
    straight_service, resumed_service = service(replicas=2), service(replicas=2)
    run(straight_service, [idle] * 720)
    run(resumed_service, [idle] * 720)
    straight = desired(run(straight_service, SCRIPT, start=720)[0])
    resumed = desired(run(resumed_service, SCRIPT, restart_at=0, start=720)[0])
    assert resumed == straight and max(straight) == 8


def test_a_busy_service_writes_what_a_restart_needs():
    stored = service(replicas=2)
    load = [busy(2 + i % 3, 4 + i % 2, 1.0 + 0.1 * i) for i in range(12)]
    plans, writes = run(stored, [idle] * 10 + load)
    sizes = desired(plans)
    assert all(writes[10:]), writes   # each pass's samples change the window's estimates: each is written
    st = stored.body["status"]
    assert st["lastSignals"]["requestRate"] == 2.1 and st["queueDepth"] == 2 + 11 % 3
    history = ScaleHistory.from_dict(st["scalingHistory"])
    assert history.queue_samples[-1][:3] == (T0 + 5 * 21, 2.0 + 11 % 3, 4.0 + 11 % 2)
    assert history.queue_samples[0][0] >= T0 + 5 * 21 - 30  # one metric window
    # read back by an operator that restarts for the next pass, the history is the one the operator decided from:
    # what moves at every pass (the newest recommendation's last pass, the last traffic) is taken at this one
    last_pass = T0 + 5 * 21
    assert history_for(st["scalingHistory"], None, previous_pass=last_pass) == plans[-1].decision.history
    assert max(sizes) > 2 and history.recommendations[-1][1] == plans[-1].decision.recommendation


def test_a_quiet_window_keeps_the_samples_status_holds():
    stored = {"queueSamples": [["2027-01-15T08:00:00Z", 0.0, 0.0, 2]]}
    quiet = replace(ScaleHistory(), queue_samples=((T0, 0.0, 3.0, 2), (T0 + 5, 0.0, 3.0, 2)))
    assert is_quiet(quiet.queue_samples)
    assert history_status(quiet, stored, T0 + 5)["queueSamples"] == stored["queueSamples"]
    # a sample with requests waiting, or another ready count, is written
    for changed in ((T0 + 5, 1.0, 3.0, 2), (T0 + 5, 0.0, 3.0, 3), (T0 + 5, 0.0, 4.0, 2)):
        moving = replace(quiet, queue_samples=(quiet.queue_samples[0], changed))
        assert not is_quiet(moving.queue_samples)
        assert len(history_status(moving, stored, T0 + 5)["queueSamples"]) == 2
    # nothing stored yet: written
    assert len(history_status(quiet, {}, T0 + 5)["queueSamples"]) == 2


def test_steady_traffic_and_missing_metrics_write_only_when_they_begin():
    """lastTrafficTime would move at every pass with traffic, or with no metrics (unknown counts as traffic)."""
    steady = busy(0, 4, 1.0)   # requests running, none waiting: a quiet window, and traffic at every pass
    missing = lambda now: Signals.missing("no kubeinfer_num_requests_waiting series", now)  # noqa: E731
    stored = service(replicas=2, minReplicas=2)
    plans, writes = run(stored, [steady] * 20 + [missing] * 20)
    assert writes[0] == 1 and sum(writes[1:20]) == 0, writes
    assert writes[20] == 1 and sum(writes[21:]) == 0, writes   # the hold, its conditions, its Warning
    history = stored.body["status"]["scalingHistory"]
    assert history["trafficAtLastPass"] is True and history["lastTrafficTime"] == "2027-01-15T08:00:00Z"


def test_a_restart_at_any_pass_scales_to_zero_when_the_uninterrupted_operator_does():
    script = [busy(0, 4, 1.0)] * 10 + [idle] * 10 + [busy(1, 2, 0.5)] * 3 + [idle] * 30
    config = {"minReplicas": 0, "scaleToZeroIdleSeconds": 60}
    straight = desired(run(service(replicas=2, **config), script)[0])
    assert straight[-1] == 0 and straight.index(0) == 22 + 12, straight   # 60 s after the last traffic
    for k in range(1, len(script)):
        resumed = desired(run(service(replicas=2, **config), script, restart_at=k)[0])
        assert resumed == straight, f"restart before pass {k}"


def test_a_status_written_by_an_older_operator_is_rewritten_once():
    """An older operator wrote the pass's time in lastSignals and a recommendation per pass: the first pass of
    this one removes the time (a merge patch keeps a member it does not null), then nothing is written."""
    stored = service(replicas=2, minReplicas=2)
    run(stored, [idle] * 10)
    st = stored.body["status"]
    st["lastSignals"]["timestamp"] = "2027-01-15T08:00:45Z"
    recommendation = st["scalingHistory"]["recommendations"][-1]
    st["scalingHistory"]["recommendations"] = [[f"2027-01-15T08:00:{s:02d}Z", *recommendation[1:]]
                                               for s in range(0, 50, 5)]
    plans, writes = run(stored, [idle] * 20, restart_at=0, start=10)
    assert writes[0] == 1 and sum(writes[1:]) == 0, writes
    assert "timestamp" not in stored.body["status"]["lastSignals"]
    assert set(desired(plans)) == {2}
