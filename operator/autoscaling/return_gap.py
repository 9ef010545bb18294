"""How long after the need falls it comes back: the history the predictive policy's release reads. Pure.

A fall opens when the fleet's need drops below the fleet (at `level` replicas); it closes when the need comes back
half the way from the lowest it reached to `level`. The seconds between are one return gap; the learned gap is
their running mean (the last gap weighted a half). A need that never comes back leaves its fall open, and a late
return then counts as a long gap, which is what it was.

The release reads it as an expected cost (`comes_back_within`): releasing a replica the need will want again costs
a re-order (`reorder_s`: one cold start billed, and the requests that miss their target while it starts, in
replica-seconds); keeping it costs the seconds it idles until then. So a fleet whose need came back sooner than a
re-order costs is released slowly, and one whose need came back later, or has not come back yet, promptly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReturnGap:
    fell_at: float | None = None     # when the open fall began
    level: int = 0                   # the fleet the need fell from
    bottom: int = 0                  # the lowest need since
    gap_s: float | None = None       # the learned return gap
    returns: int = 0                 # falls that came back

    def observe(self, now: float, current: int, keep_need: int, up_need: int) -> ReturnGap:
        """After a pass that saw the need to keep (`keep_need`) and to order (`up_need`) on `current` replicas."""
        if self.fell_at is None:
            if keep_need < current:
                return ReturnGap(now, current, keep_need, self.gap_s, self.returns)
            return self
        bottom = min(self.bottom, keep_need)
        depth = self.level - bottom
        if depth >= 2 and 2 * (up_need - bottom) >= depth:
            gap = now - self.fell_at
            learned = gap if self.gap_s is None else (self.gap_s + gap) / 2
            return ReturnGap(None, 0, 0, learned, self.returns + 1)
        if depth < 2 and keep_need >= current:
            return ReturnGap(None, 0, 0, self.gap_s, self.returns)   # a dip of one replica, over: not a fall
        return ReturnGap(self.fell_at, self.level, bottom, self.gap_s, self.returns)

    def comes_back_within(self, reorder_s: float) -> bool:
        """Whether the need, after its falls so far, came back sooner than a re-order costs (`reorder_s`)."""
        return self.gap_s is not None and self.gap_s <= reorder_s

    def to_dict(self) -> dict:
        return {"fellAt": self.fell_at, "level": self.level, "bottom": self.bottom, "gapSeconds": self.gap_s,
                "returns": self.returns}

    @classmethod
    def from_dict(cls, data: dict | None) -> ReturnGap:
        if not data:
            return cls()
        return cls(data.get("fellAt"), data.get("level", 0), data.get("bottom", 0), data.get("gapSeconds"),
                   data.get("returns", 0))
