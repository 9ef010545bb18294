"""What of the policy's history the autoscaler keeps in `status.scalingHistory`, and when it rewrites it.

The history is in status so that a restarted operator decides as an uninterrupted one would. A status that
changes at every pass is written at every pass (at 1,000 autoscaled services, ~200 writes/s of an idle fleet),
so the running operator keeps the exact history in memory between passes (`RememberedHistory`) and status
holds what a restart needs, which only changes when the service's situation does:
- Recommendations are kept as runs of equal values by the policy itself (`policy._record`): a steady
  recommendation adds nothing. The newest run's last pass is not kept; read back, the run is taken to have held
  until the latest time the previous pass can have been (one interval before the restart's first pass: the loop
  waits an interval after each pass), never earlier than it was, so a restarted operator keeps a recommendation
  in force as long as the uninterrupted one does, or longer.
- Queue samples (`observations.observe_queue`) carry their signal time, so every pass makes a new one. A quiet
  window, every sample in it with nothing waiting and the same running count and ready replicas, is not
  rewritten: status keeps the samples it holds. Read back after a restart, the window then lacks samples equal
  to the last one kept. What that changes (docs/autoscaling.md, "Status writes"): the queue's growth at the first
  pass after the restart is measured since the last kept sample, and within one metric window of the restart the
  arrival rate is measured over a shorter span; with a queue that was empty, that estimate is never lower.
- `lastTrafficTime` would move at every pass that sees traffic, or no metrics (unknown counts as traffic for the
  idle clock). While it does, status says `trafficAtLastPass: true` and keeps the time the stretch began; read
  back, the last traffic is taken to be the latest time the previous pass can have been (as for the
  recommendations: the idle clock starts no earlier than the uninterrupted one's).
- Every other field changes only with the situation (ready count, scale events, learned capacity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubeinfer.operator.autoscaling.policies.types import ScaleHistory
from kubeinfer.operator.reconcile.status import merge_patched

TRAFFIC_AT_LAST_PASS = "trafficAtLastPass"


@dataclass(frozen=True)
class RememberedHistory:
    """The history of the last pass (exact) and the `status.scalingHistory` that pass left in the object."""

    written: dict[str, Any]
    history: ScaleHistory


def is_quiet(samples: tuple[tuple[float, float, float, int], ...]) -> bool:
    """Whether every sample of the window has nothing waiting and the same running count and ready replicas."""
    return bool(samples) and all(q == 0 and (n, r) == samples[-1][2:] for _, q, n, r in samples)


def history_status(history: ScaleHistory, stored: Mapping[str, Any] | None, now: float) -> dict[str, Any]:
    """`status.scalingHistory` for `history`, decided at `now`, given the one status holds (`stored`)."""
    stored = stored or {}
    written = {**history.to_dict(), TRAFFIC_AT_LAST_PASS: None}
    if "queueSamples" in stored and is_quiet(history.queue_samples):
        written["queueSamples"] = stored["queueSamples"]
    if history.last_traffic_time == now:
        written[TRAFFIC_AT_LAST_PASS] = True
        if stored.get(TRAFFIC_AT_LAST_PASS):
            written["lastTrafficTime"] = stored.get("lastTrafficTime")
    return written


def history_for(stored: Mapping[str, Any] | None, remembered: RememberedHistory | None,
                previous_pass: float | None) -> ScaleHistory:
    """The history to decide from: the remembered one while status still holds what its pass wrote, else the
    one status holds (a restarted operator, or a status someone else changed), with what moves at every pass taken
    at `previous_pass` (None: at this pass)."""
    if remembered is not None and stored is not None and merge_patched(remembered.written) == merge_patched(stored):
        return remembered.history
    history = ScaleHistory.from_dict(stored)
    if stored and stored.get(TRAFFIC_AT_LAST_PASS):
        history = replace(history, last_traffic_time=previous_pass)  # None: this pass (`reactive.decide`)
    if previous_pass is None or not history.recommendations:
        return history
    return replace(history, recommended_until=max(previous_pass, history.recommendations[-1][0]))
