"""How long a new replica takes to serve, learned from the service's own pods: creation -> Ready.

Why: the autoscaler sizes an overload answer for the queue it projects over the time a replica it
orders now needs before it serves. `spec.autoscaling.initialDelaySeconds` is a guess written once; the
pods say what it really is on this cluster (scheduling, image pull, model download and load), and it
moves with the node, the cache and the model. The learned value replaces the guess once one pod has
been seen becoming Ready; until then the guess is all there is.

Policy:
- One observation per pod: `metadata.creationTimestamp` -> the `Ready` condition's
  `lastTransitionTime`, read while the pod is Ready. A pod whose containers restarted is skipped: its
  Ready time comes after a crash, not after a cold start.
- Only pods that became Ready at or after the newest kept observation are new (the record's
  watermark), so a long-lived pod whose observation has left the record is not counted again.
- The record keeps the last MAX_SAMPLES observations; the learned cold start is their median, which one
  slow node or one cold image cache does not move much.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeinfer.operator.times import rfc3339_precise, unix

MAX_SAMPLES = 9


@dataclass(frozen=True)
class ColdStartSample:
    pod: str
    created: float  # unix seconds
    ready: float  # unix seconds

    @property
    def seconds(self) -> float:
        return self.ready - self.created


def parse_time(value: str | None) -> float | None:
    """An RFC 3339 timestamp of the API (`2026-11-23T13:30:03Z`) in unix seconds; None for none."""
    return unix(value) if value else None


def ready_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's Ready condition (None before the kubelet reports one)."""
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)


def observe_pod(pod: Mapping[str, Any]) -> ColdStartSample | None:
    """The pod's creation -> Ready, or None while it is not Ready, lacks a timestamp, or has restarted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = ready_condition(pod)
    if ready is None or ready.get("status") != "True" or meta.get("deletionTimestamp"):
        return None
    if any((cs.get("restartCount") or 0) > 0 for cs in status.get("containerStatuses") or []):
        return None
    created, ready_at = parse_time(meta.get("creationTimestamp")), parse_time(ready.get("lastTransitionTime"))
    if created is None or ready_at is None or ready_at < created or not meta.get("name"):
        return None
    return ColdStartSample(meta["name"], created, ready_at)


@dataclass(frozen=True)
class ColdStartRecord:
    """The last observations, oldest first (by Ready time)."""

    samples: tuple[ColdStartSample, ...] = ()

    @property
    def seconds(self) -> float | None:
        """The learned cold start: the median of the kept observations (None before the first)."""
        return statistics.median(s.seconds for s in self.samples) if self.samples else None

    def with_samples(self, new: Iterable[ColdStartSample]) -> ColdStartRecord:
        """Add the samples newer than the watermark (the last kept Ready time) not already kept."""
        known = {s.pod for s in self.samples}
        watermark = self.samples[-1].ready if self.samples else float("-inf")
        fresh = sorted((s for s in new if s.pod not in known and s.ready >= watermark), key=lambda s: s.ready)
        if not fresh:
            return self
        return ColdStartRecord((self.samples + tuple(fresh))[-MAX_SAMPLES:])

    def with_pods(self, pods: Iterable[Mapping[str, Any]]) -> ColdStartRecord:
        return self.with_samples(s for s in map(observe_pod, pods) if s is not None)

    def to_status(self) -> dict[str, Any]:
        """`status.coldStartSeconds` and `status.coldStartSamples` (both declared in the CRD schema)."""
        seconds = self.seconds
        return {
            "coldStartSeconds": None if seconds is None else round(seconds, 3),
            "coldStartSamples": [{"pod": s.pod, "createdAt": rfc3339_precise(s.created),
                                  "readyAt": rfc3339_precise(s.ready),
                                  "seconds": round(s.seconds, 3)} for s in self.samples],
        }

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> ColdStartRecord:
        """Tolerant: a missing or malformed list gives a fresh record."""
        samples = []
        for item in (status or {}).get("coldStartSamples") or []:
            created, ready = parse_time(item.get("createdAt")), parse_time(item.get("readyAt"))
            if item.get("pod") and created is not None and ready is not None:
                samples.append(ColdStartSample(item["pod"], created, ready))
        return cls(tuple(sorted(samples, key=lambda s: s.ready)[-MAX_SAMPLES:]))
