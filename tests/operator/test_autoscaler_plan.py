"""The autoscaler's pure pass (`plan.plan_pass`): what it writes for a stored object, pods and signals."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kubeinfer.operator.autoscaling import plan as plan_module
from kubeinfer.operator.autoscaling.policies.types import ScaleHistory
from kubeinfer.operator.autoscaling.signals import pods as pods_reading
from kubeinfer.operator.autoscaling.signals.measured import Signals
from kubeinfer.operator.times import rfc3339 as iso
from support.autoscale_objects import NOW, body, plan, pod, settled_status

MANUAL = plan_module.MANUAL_SCALE_OVERRIDDEN


def test_replica_counts_treat_young_unready_missing_and_deleting_pods_as_pending():
    pods = [pod("a"), pod("b", age=10), pod("c", ready=False), pod("d", deleting=True)]
    counts = pods_reading.replica_counts(4, pods, initial_delay_s=60, now=NOW)
    assert (counts.current, counts.ready, counts.pending) == (4, 1, 3)
    # the Deployment has not created the 5th and 6th pods yet: they are pending too
    assert pods_reading.replica_counts(6, pods, 60, NOW).pending == 5


def test_scrape_targets_are_the_ready_live_pods():
    pods = [pod("a", ip="10.0.0.1"), pod("b", ready=False, ip="10.0.0.2"), pod("c", ip=None),
            pod("d", deleting=True, ip="10.0.0.4")]
    assert pods_reading.scrape_targets(pods) == {"http://10.0.0.1:8000/metrics": (None, None)}   # neither known
    ready = next(c for c in pods[0]["status"]["conditions"] if c["type"] == "Ready")
    ready["lastTransitionTime"] = "2026-11-27T12:00:00Z"   # Ready since: when it began to serve
    pods[0]["metadata"]["uid"] = "u-1"
    assert pods_reading.scrape_targets(pods) == {"http://10.0.0.1:8000/metrics": (1795780800.0, "u-1")}


def test_scale_up_writes_status_then_replicas_and_one_event():
    b = body(replicas=2, status=settled_status(2))
    p = plan(b, Signals(NOW, queue_depth=20, num_running=8, ttft_p95_seconds=0.3), [pod("a"), pod("b")])
    # (8 + 20) / (4 + 2) -> 5
    assert (p.current, p.decision.desired_replicas, p.replicas) == (2, 5, 5)
    assert [(e.type, e.reason) for e in p.events] == [("Normal", "ScaleUp")]
    assert p.events[0].message.startswith("2 -> 5 replicas: queue 20 on 2 ready")
    st = p.status
    assert (st["desiredReplicas"], st["queueDepth"], st["ttftP95Seconds"]) == (5, 20, 0.3)
    assert st["lastScaleTime"] == iso(NOW)
    assert st["scalingHistory"]["events"][-1] == {"time": iso(NOW), "from": 2, "to": 5, "reason": "ScaleUp"}
    assert st["lastSignals"]["recommendation"] == 5
    types = {c["type"]: c for c in st["conditions"]}
    assert types["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # reconcile's condition kept
    assert types["ScalingActive"]["status"] == "True" and types["ScalingActive"]["reason"] == "ScaleUp"
    assert types["MetricsAvailable"]["status"] == "True" and types["MetricsAvailable"]["observedGeneration"] == 3


def test_steady_state_writes_no_replicas_and_no_event():
    b = body(replicas=2, status=settled_status(2))
    p = plan(b, Signals(NOW, queue_depth=4, num_running=8), [pod("a"), pod("b")])
    assert p.decision.reason == "WithinTolerance" and p.replicas is None and p.events == ()
    assert "lastScaleTime" not in p.status


def test_manual_change_is_overridden_from_the_recorded_decision():
    b = body(replicas=6, status=settled_status(2))  # kubectl scale --replicas 6
    p = plan(b, Signals(NOW, queue_depth=4, num_running=8), [pod("a"), pod("b")])
    assert (p.current, p.decision.desired_replicas, p.replicas) == (2, 2, 2)
    assert [e.reason for e in p.events] == ["ManualScaleOverridden"]
    assert "set to 6" in p.events[0].message and "set it to 2" in p.events[0].message


def test_first_pass_starts_from_the_users_replicas_and_writes_them_when_unset():
    p = plan(body(replicas=3), Signals(NOW, queue_depth=6, num_running=9), [pod("a"), pod("b"), pod("c")])
    assert p.current == 3 and p.events == () and p.replicas is None
    # no spec.replicas: the start size (minReplicas, at least 1) is written so `kubectl get` shows it
    p = plan(body(replicas=None), Signals(NOW, queue_depth=0, num_running=0), [pod("a")])
    assert p.current == 1 and p.replicas == 1 and p.events == ()


def test_missing_metrics_hold_warn_once_and_clear_the_numbers():
    b = body(replicas=3, status=settled_status(3))
    p = plan(b, Signals.missing("prometheus query failed: boom", NOW), [pod("a"), pod("b"), pod("c")])
    assert p.decision.desired_replicas == 3 and p.replicas is None
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "MetricsUnavailable")]
    assert p.status["queueDepth"] is None and p.status["ttftP95Seconds"] is None
    types = {c["type"]: c for c in p.status["conditions"]}
    assert types["ScalingActive"]["status"] == "False" and types["MetricsAvailable"]["status"] == "False"
    assert "boom" in types["MetricsAvailable"]["message"]
    # the next pass, still without metrics: no second Warning
    again = plan(body(replicas=3, status={**b["status"], **p.status}), Signals.missing("boom", NOW), [pod("a")])
    assert again.events == ()


def test_status_times_are_rfc3339():
    b = body(replicas=1, status=settled_status(1))
    p = plan(b, Signals(NOW - 0.25, queue_depth=12, num_running=4), [pod("a")])
    # no time: it would change status at every pass (the null removes the one an older operator wrote)
    assert p.status["lastSignals"]["timestamp"] is None
    history = p.status["scalingHistory"]
    assert history["startedAt"] == "2027-01-15T07:00:00Z" and history["lastScaleTime"] == "2027-01-15T08:00:00Z"
    assert history["events"][-1]["time"] == "2027-01-15T08:00:00Z"
    assert [r[0] for r in history["recommendations"]][-1] == "2027-01-15T08:00:00Z"
    assert history["queueSamples"][-1][0] == "2027-01-15T07:59:59.75Z"
    # read back, the history is the one the policy made, but for the newest recommendation run's last pass
    assert ScaleHistory.from_dict(history) == replace(p.decision.history, recommended_until=None)


def test_a_history_written_with_epoch_numbers_is_still_read():
    """An operator before RFC 3339 wrote unix seconds: a restarted newer one resumes from them."""
    hist = ScaleHistory(started_at=NOW - 3600, last_ready=2, ready_changed_at=NOW - 3600, last_traffic_time=NOW,
                        recommendations=((NOW - 30, 2, 0),), queue_samples=((NOW - 5, 0.0, 1.0, 2),))
    old = {"startedAt": NOW - 3600, "recommendations": [[NOW - 30, 2, 0]], "queueSamples": [[NOW - 5, 0.0, 1.0, 2]],
           "events": [], "lastTrafficTime": NOW, "lastReady": 2, "readyChangedAt": NOW - 3600}
    assert ScaleHistory.from_dict(old) == hist
    assert ScaleHistory.from_dict(hist.to_dict()) == hist


def test_desired_replicas_written_by_reconcile_is_not_a_decision():
    """Before the first pass reconcile writes the starting size as desiredReplicas (DESIRED is never blank);
    with no scalingHistory yet it is no decision of the autoscaler, so a different spec.replicas is the user's
    starting size, not a manual scale to override."""
    b = body(replicas=3, status={"desiredReplicas": 1})
    p = plan(b, Signals(NOW, queue_depth=6, num_running=6), [pod("a"), pod("b"), pod("c")])
    assert p.current == 3
    assert MANUAL not in [e.reason for e in p.events]


def test_metrics_coming_back_is_a_normal_event():
    b = body(replicas=3, status=settled_status(3))
    held = plan(b, Signals.missing("boom", NOW), [pod("a"), pod("b"), pod("c")])
    back = plan(body(replicas=3, status={**b["status"], **held.status}), Signals(NOW, queue_depth=6, num_running=6),
                [pod("a"), pod("b"), pod("c")])
    assert ("Normal", "SignalsRead") in [(e.type, e.reason) for e in back.events]
    (read,) = [e for e in back.events if e.reason == "SignalsRead"]
    assert read.message.startswith("MetricsAvailable=True: queue 6")


def loaded_pod(name: str, loaded_s: float, age: float = 3600) -> dict[str, Any]:
    """A Ready pod that took `loaded_s` from creation to Ready."""
    p = pod(name, age=age)
    p["status"]["conditions"][0]["lastTransitionTime"] = iso(NOW - age + loaded_s)
    return p


def test_the_cold_start_learned_from_pods_replaces_initial_delay_in_the_projection():
    # The queue grew from 20 to 60 in 10 s (4/s) on 2 ready replicas running 4 each, target 2 waiting.
    history = {**ScaleHistory.from_dict(settled_status(2)["scalingHistory"]).to_dict(),
               "queueSamples": [[NOW - 10, 20.0, 8.0, 2]]}
    signals = Signals(NOW, queue_depth=60, num_running=8)
    guessed = plan(body(replicas=2, status={**settled_status(2), "scalingHistory": history}, maxReplicas=100),
                   signals, [pod("a"), pod("b")])
    # initialDelaySeconds 60: (8 + 60 + 4 * 60) / (4 + 2) = 51.3 -> 52
    assert guessed.decision.recommendation == 52 and "coldStartSeconds" not in guessed.status
    pods = [loaded_pod("a", 9), loaded_pod("b", 12, age=3000), loaded_pod("c", 600, age=2000)]
    learned = plan(body(replicas=3, status={**settled_status(3), "scalingHistory": history}, maxReplicas=100),
                   signals, pods)
    # median of 9, 12 and 600 s = 12 s; 3 ready replicas running 8 in all
    assert learned.status["coldStartSeconds"] == 12
    assert [s["pod"] for s in learned.status["coldStartSamples"]] == ["a", "b", "c"]
    assert learned.decision.recommendation == math.ceil((8 + 60 + 4 * 12) / (8 / 3 + 2))
    assert "over a 12s cold start" in learned.decision.message
    # the next pass reads the record back from status and adds nothing for the same pods
    again = plan(body(replicas=3, status={**settled_status(3), **learned.status}, maxReplicas=100), signals, pods)
    assert again.status["coldStartSamples"] == learned.status["coldStartSamples"]
