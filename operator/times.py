"""Times as the Kubernetes API writes them: RFC 3339 in UTC (`2026-11-25T02:14:03Z`), never epoch numbers.

Every time the operator puts in status goes through `rfc3339` (whole seconds, as metav1.Time) or
`rfc3339_precise` (the fraction kept, as metav1.MicroTime: the autoscaler's windows need sub-second times);
`unix` reads both back, and the epoch numbers an older operator wrote.
"""

from __future__ import annotations

import datetime

UTC = datetime.timezone.utc


def rfc3339(ts: float) -> str:
    """`2026-11-25T02:14:03Z`: whole seconds."""
    return datetime.datetime.fromtimestamp(ts, UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def rfc3339_precise(ts: float) -> str:
    """`2026-11-25T02:14:03.25Z`: to the microsecond, trailing zeros (and a whole-second fraction) left out."""
    stamp = datetime.datetime.fromtimestamp(ts, UTC)
    text = stamp.replace(microsecond=0).isoformat().replace("+00:00", "")
    fraction = f"{stamp.microsecond:06d}".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


def unix(value: str | float | int | None) -> float | None:
    """Unix seconds of an RFC 3339 time or of an epoch number (what an older operator wrote); None for none."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00")).timestamp()


def unix_or_none(value: str | float | int | None) -> float | None:
    """`unix`, or None for a value that is neither (a hand-edited status must not stop the operator)."""
    try:
        return unix(value)
    except (TypeError, ValueError):
        return None
