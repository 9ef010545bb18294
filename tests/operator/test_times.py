"""Times in status are RFC 3339; epoch numbers an older operator wrote are still read."""

from __future__ import annotations

import pytest

from kubeinfer.operator.times import rfc3339, rfc3339_precise, unix, unix_or_none

T = 1_795_556_425.2051   # the epoch float the issue saw in `kubectl describe`


def test_whole_seconds_as_metav1_time() -> None:
    assert rfc3339(T) == "2026-11-24T21:40:25Z"


@pytest.mark.parametrize("ts, text", [(T, "2026-11-24T21:40:25.2051Z"), (1_795_556_425.0, "2026-11-24T21:40:25Z"),
                                      (1_795_556_425.5, "2026-11-24T21:40:25.5Z")])
def test_precise_times_keep_the_fraction_without_trailing_zeros(ts: float, text: str) -> None:
    assert rfc3339_precise(ts) == text
    assert unix(text) == pytest.approx(ts, abs=1e-6)


def test_both_forms_are_read() -> None:
    assert unix("2026-11-24T21:40:25Z") == 1_795_556_425.0
    assert unix("2026-11-24T22:40:25+01:00") == 1_795_556_425.0
    assert unix(T) == T and unix(1_795_556_425) == 1_795_556_425.0
    assert unix(None) is None and unix("") is None
    assert unix_or_none("yesterday") is None
