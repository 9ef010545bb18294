"""Conditions and status fields computed from a Deployment and its pods (pure functions)."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.reconcile import status

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def dep(replicas: int = 0, ready: int = 0, updated: int = 0, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"status": {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": updated,
                       "conditions": conditions or []}}


def waiting(reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p-1"}, "status": {"containerStatuses": [
        {"name": "runtime", "image": "reg/rt:1", "state": {"waiting": {"reason": reason, "message": message}},
         **extra}]}}


def unschedulable(message: str) -> dict[str, Any]:
    return {"metadata": {"name": "p-2"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def by_type(conds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conds}


def conds(desired: int, deployment: dict[str, Any] | None, pods: list[dict[str, Any]] = (), errors: list[str] = ()):
    return by_type(status.conditions_for(desired, deployment, status.pod_problems(list(pods)), list(errors)))


def test_all_ready() -> None:
    c = conds(2, dep(2, 2, 2))
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "Available")
    assert "2/2" in c["Ready"]["message"]
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "Complete")
    assert c["Degraded"]["status"] == "False"


def test_loading_model_is_progressing_not_degraded() -> None:
    c = conds(2, dep(2, 1, 2))
    assert c["Ready"]["status"] == "True"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "LoadingModel")
    assert c["Degraded"]["status"] == "False"


def test_rollout_in_progress() -> None:
    c = conds(3, dep(4, 3, 1))
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RollingOut")


def test_scale_down_in_progress() -> None:
    c = conds(1, dep(3, 3, 3))
    assert c["Progressing"]["reason"] == "ScalingDown"


def test_no_deployment_yet() -> None:
    c = conds(1, None)
    assert c["Ready"]["status"] == "False" and c["Progressing"]["reason"] == "Creating"


def test_scaled_to_zero() -> None:
    c = conds(0, dep())
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert c["Progressing"]["status"] == "False"


def test_image_pull_failure_is_degraded_with_the_image_named() -> None:
    c = conds(1, dep(1, 0, 1), [waiting("ImagePullBackOff", "Back-off pulling image")])
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "ImagePullFailed")
    assert "reg/rt:1" in c["Degraded"]["message"] and "p-1" in c["Degraded"]["message"]
    assert c["Ready"]["reason"] == "ImagePullFailed"
    assert c["Progressing"]["reason"] == "ImagePullFailed"


def test_crash_loop_reports_restarts_and_exit() -> None:
    pod = waiting("CrashLoopBackOff", restartCount=5,
                  lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137}})
    c = conds(1, dep(1, 0, 1), [pod])
    assert c["Degraded"]["reason"] == "CrashLoop"
    assert "5 restarts" in c["Degraded"]["message"] and "OOMKilled" in c["Degraded"]["message"]


def test_crash_loop_quotes_the_last_line_the_runtime_said() -> None:
    said = "2026-11-23 INFO loading\nkubeinfer: error: model folder '/models/x' does not exist\n\n"
    pod = waiting("CrashLoopBackOff", restartCount=2,
                  lastState={"terminated": {"reason": "Error", "exitCode": 2, "message": said}})
    message = conds(1, dep(1, 0, 1), [pod])["Degraded"]["message"]
    assert message.endswith("last exit Error (code 2): kubeinfer: error: model folder '/models/x' does not exist")


def test_no_free_gpus_is_called_insufficient_gpu() -> None:
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    c = conds(1, dep(1, 0, 1), [unschedulable(msg)])
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "InsufficientGPU")
    assert msg in c["Degraded"]["message"]
    assert c["Progressing"]["reason"] == "InsufficientGPU"


def test_other_unschedulable_is_not_blamed_on_gpus() -> None:
    c = conds(1, dep(1, 0, 1), [unschedulable("0/4 nodes: node(s) had untolerated taint")])
    assert c["Degraded"]["reason"] == "Unschedulable"


def test_missing_secret_surfaces_as_config_error() -> None:
    c = conds(1, dep(1, 0, 1), [waiting("CreateContainerConfigError", 'secret "keys" not found')])
    assert c["Degraded"]["reason"] == "ContainerConfigError"
    assert 'secret "keys" not found' in c["Degraded"]["message"]


def test_most_actionable_problem_names_the_reason() -> None:
    pods = [unschedulable("Insufficient nvidia.com/gpu"), waiting("ErrImagePull")]
    assert conds(2, dep(2, 0, 2), pods)["Degraded"]["reason"] == "ImagePullFailed"


def test_rollout_deadline_and_quota_from_the_deployment() -> None:
    d = dep(1, 1, 0, [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                        "message": "ReplicaSet has timed out progressing."}])
    assert conds(1, d)["Degraded"]["reason"] == "ProgressDeadlineExceeded"
    d = dep(0, 0, 0, [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                        "message": "exceeded quota: gpus"}])
    c = conds(1, d)
    assert c["Degraded"]["reason"] == "ReplicaFailure" and "exceeded quota" in c["Degraded"]["message"]


def test_invalid_spec_sets_all_three_with_the_message() -> None:
    c = conds(1, dep(1, 1, 1), errors=["runtime.extraArgs must not set --port"])
    for type_ in ("Ready", "Progressing", "Degraded"):
        assert c[type_]["reason"] == "InvalidSpec"
        assert "--port" in c[type_]["message"]
    assert c["Degraded"]["status"] == "True" and c["Ready"]["status"] == "False"


def test_transition_time_kept_while_status_holds_and_others_conditions_kept() -> None:
    foreign = {"type": "ScalingActive", "status": "True", "reason": "Policy", "lastTransitionTime": NOW}
    first = status.merge_conditions([foreign], status.conditions_for(1, dep(1, 0, 1), [], []), NOW, 1)
    second = status.merge_conditions(first, status.conditions_for(1, dep(1, 0, 1), [], []), LATER, 1)
    assert second == first  # nothing changed: identical, so no write
    third = by_type(status.merge_conditions(second, status.conditions_for(1, dep(1, 1, 1), [], []), LATER, 2))
    assert third["Ready"]["lastTransitionTime"] == LATER and third["Ready"]["status"] == "True"
    assert third["Degraded"]["lastTransitionTime"] == NOW  # stayed False
    assert third["Ready"]["observedGeneration"] == 2
    assert third["ScalingActive"] == foreign


def test_compute_status_fields_and_patch() -> None:
    s = status.compute_status(desired=2, selector="a=b", endpoint="http://x/v1", generation=3,
                              deployment=dep(2, 1, 2), pods=[], spec_errors=[], current={}, now=NOW)
    assert (s["replicas"], s["readyReplicas"], s["updatedReplicas"]) == (2, 1, 2)
    assert s["selector"] == "a=b" and s["endpoint"] == "http://x/v1" and s["observedGeneration"] == 3
    current = {**s, "queueDepth": 4.0}
    again = status.compute_status(desired=2, selector="a=b", endpoint="http://x/v1", generation=3,
                                  deployment=dep(2, 1, 2), pods=[], spec_errors=[], current=current, now=LATER)
    assert status.status_patch(current, again) == {}
    ready = status.compute_status(desired=2, selector="a=b", endpoint="http://x/v1", generation=3,
                                  deployment=dep(2, 2, 2), pods=[], spec_errors=[], current=current, now=LATER)
    assert set(status.status_patch(current, ready)) == {"readyReplicas", "conditions"}


def observe(current: dict[str, Any], desired: int = 2, autoscaled: bool | None = False) -> dict[str, Any]:
    return status.compute_status(desired=desired, selector="a=b", endpoint="http://x/v1", generation=1,
                                 deployment=dep(1, 1, 1), pods=[], spec_errors=[], current=current, now=NOW,
                                 autoscaled=autoscaled)


def test_desired_replicas_is_what_the_spec_asks_without_autoscaling() -> None:
    assert observe({})["desiredReplicas"] == 2
    # kubectl scale, or an autoscaler's decision left from before autoscaling was turned off: the spec wins
    assert observe({"desiredReplicas": 5})["desiredReplicas"] == 2


def test_with_autoscaling_reconcile_writes_only_the_starting_size() -> None:
    assert observe({}, desired=3, autoscaled=True)["desiredReplicas"] == 3
    s = observe({"desiredReplicas": 5, "scalingHistory": {"startedAt": NOW}}, desired=3, autoscaled=True)
    assert "desiredReplicas" not in s and "scalingHistory" not in s   # the autoscaler's decision stands


def test_turning_autoscaling_off_drops_the_autoscalers_memory() -> None:
    current = {"desiredReplicas": 5, "scalingHistory": {"startedAt": NOW}}
    s = observe(current, desired=2, autoscaled=False)
    assert status.status_patch(current, s)["scalingHistory"] is None
    assert status.status_patch({**current, **s, "scalingHistory": None}, s) == {}
    # a spec that could not be parsed says nothing about autoscaling: its fields stay
    unknown = observe(current, desired=0, autoscaled=None)
    assert "desiredReplicas" not in unknown and "scalingHistory" not in unknown


def test_ready_says_what_is_under_way_while_no_replica_is_ready() -> None:
    """Ready's reason is kubectl get's STATUS column."""
    assert conds(1, None)["Ready"]["reason"] == "Creating"
    assert conds(2, dep(2, 0, 2))["Ready"]["reason"] == "LoadingModel"
    assert conds(2, dep(2, 0, 1))["Ready"]["reason"] == "RollingOut"
    loading = conds(2, dep(2, 0, 2))
    assert loading["Ready"]["message"] == loading["Progressing"]["message"]   # one Event for both
    assert conds(2, dep(2, 1, 2))["Ready"]["reason"] == "Available"


def test_a_null_member_is_equal_to_the_missing_one_a_merge_patch_left():
    """A merge patch removes the object members it sets to null: what the API server stores has none, so the next
    identical status must compare equal, or it is written again at every pass."""
    planned = {"lastSignals": {"queueDepth": 0.0, "ttftP95Seconds": None, "error": None}, "queueDepth": None}
    stored = {"lastSignals": {"queueDepth": 0.0}}
    assert status.merge_patched(planned["lastSignals"]) == stored["lastSignals"]
    assert status.status_patch(stored, planned) == {}
    # a value that goes to null is still written (the null removes it), and a changed one too
    assert status.status_patch({"lastSignals": {"queueDepth": 0.0, "ttftP95Seconds": 0.3}}, planned) == {
        "lastSignals": planned["lastSignals"]}
    assert status.status_patch({"lastSignals": {"queueDepth": 1.0}}, planned) == {"lastSignals": planned["lastSignals"]}
