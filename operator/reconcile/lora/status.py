"""Pure: the adapter step's outcomes as `status.adapters` and the AdaptersReady condition.

AdaptersReady (with runtime.lora):
- True, AllLoaded: every adapter is loaded on every ready replica (NoAdapters: the list is empty).
- False, AdapterFailed: some replica refused or could not be asked; the message names each failing adapter with
  its replica and the runtime's words. The adapters that loaded keep serving: each has its own entry.
- Unknown, NoReadyReplicas: no replica to ask yet.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubeinfer.operator.reconcile.lora.sync import Outcome
from kubeinfer.operator.spec import ADAPTERS_READY

MAX_MESSAGES = 3


@dataclasses.dataclass(frozen=True)
class AdapterReport:
    """What the pass writes: `entries` is status.adapters and `condition` AdaptersReady; None removes each."""

    entries: list[dict[str, Any]] | None
    condition: dict[str, Any] | None


LORA_OFF = AdapterReport(entries=None, condition=None)


def _cond(status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": ADAPTERS_READY, "status": status, "reason": reason, "message": message}


def report(adapters: list[str], ready_pods: list[str], outcomes: list[Outcome]) -> AdapterReport:
    """`adapters`: the spec's names, in order; `ready_pods`: the replicas asked; `outcomes`: their answers."""
    by_adapter: dict[str, list[Outcome]] = {name: [] for name in adapters}
    for outcome in outcomes:
        by_adapter.setdefault(outcome.adapter, []).append(outcome)
    entries = [{"name": name, "readyReplicas": sum(o.ready for o in found),
                "pods": [{"pod": o.pod, "ready": o.ready, "message": o.message}
                         for o in sorted(found, key=lambda o: o.pod)]}
               for name, found in by_adapter.items() if name in adapters]
    failed = [o for name in adapters for o in sorted(by_adapter[name], key=lambda o: o.pod) if not o.ready]
    if not adapters:
        condition = _cond("True", "NoAdapters", "spec.adapters is empty")
    elif not ready_pods:
        condition = _cond("Unknown", "NoReadyReplicas", "no ready replica to load the adapters on yet")
    elif failed:
        names = list(dict.fromkeys(o.adapter for o in failed))
        lines = [f"adapter {o.adapter} on {o.pod}: {o.message}" for o in failed]
        more = f" (and {len(lines) - MAX_MESSAGES} more)" if len(lines) > MAX_MESSAGES else ""
        condition = _cond("False", "AdapterFailed",
                          f"not loaded: {', '.join(names)}; " + "; ".join(lines[:MAX_MESSAGES]) + more)
    else:
        condition = _cond("True", "AllLoaded",
                          f"{len(adapters)} adapters loaded on {len(ready_pods)} ready replicas")
    return AdapterReport(entries=entries, condition=condition)
