"""What the operator has already seen of each child, so that a child's event which shows nothing new makes no pass.

At fleet scale most of a new InferenceService's child events are of that kind (benchmarks/operator_scale.py:
~9 passes per service during apply-all, and 1,000 services did not go idle within 18 minutes on the 2-vCPU box):
- the echo of the operator's own write: a pass applies the Deployment, Service and PodDisruptionBudget, and each
  comes back as an event showing exactly what the pass was answered;
- status-only changes of kinds whose status no pass reads: a PodDisruptionBudget's status moves with every pod
  of the service (`currentHealthy`, `disruptionsAllowed`), a Service's never matters.

A child's "view" is a digest of the object without what changes on every write (`resourceVersion`,
`managedFields`) and without the status of those kinds. An event whose digest is the one last seen for that
object (by an earlier event, or in a pass's own read or write) is no news. A deletion always is (the pass
recreates the child). Anything else, a hand edit or a status a pass reads, is news as before.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from typing import Any

STATUS_UNREAD = frozenset({"Service", "PodDisruptionBudget"})
VOLATILE_METADATA = frozenset({"resourceVersion", "managedFields"})


def digest(obj: Mapping[str, Any], kind: str | None = None) -> str:
    """The part of a child that a pass reads, hashed. `kind`: where the object does not say (watch events need
    not carry `kind` and `apiVersion`, so neither is part of the digest)."""
    kind = obj.get("kind") or kind
    kept = {key: value for key, value in obj.items()
            if key not in ("metadata", "kind", "apiVersion") and not (key == "status" and kind in STATUS_UNREAD)}
    kept["metadata"] = {key: value for key, value in (obj.get("metadata") or {}).items()
                        if key not in VOLATILE_METADATA}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _key(obj: Mapping[str, Any], kind: str | None = None) -> tuple[str, str, str] | None:
    meta = obj.get("metadata") or {}
    kind = obj.get("kind") or kind
    return (kind, meta.get("namespace") or "", meta["name"]) if kind and meta.get("name") else None


class ChildView:
    """The digest last seen per child (by kind, namespace and name: a recreated one differs in uid and creation
    time); thread-safe (handlers run in a thread pool)."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}
        self._lock = threading.Lock()

    def saw(self, obj: Mapping[str, Any] | None) -> None:
        """A pass read or wrote this object: its event showing the same is no news."""
        key = _key(obj or {})
        if key is not None:
            value = digest(obj)
            with self._lock:
                self._seen[key] = value

    def is_news(self, event_type: str | None, obj: Mapping[str, Any], kind: str | None = None) -> bool:
        """Whether this event shows something of the child no pass has seen (and remembers it as seen). `kind`:
        the child's, where the object does not say."""
        key = _key(obj, kind)
        if key is None:
            return True
        if event_type == "DELETED":
            with self._lock:
                self._seen.pop(key, None)
            return True
        value = digest(obj, kind)
        with self._lock:
            if self._seen.get(key) == value:
                return False
            self._seen[key] = value
            return True
