"""How long after the need falls it comes back: the history the predictive policy's release reads. Pure.

A fall opens when the fleet's need drops below the fleet (at `level` replicas), and records when the need first
fell below each replica count on its way down; it closes when the need comes back by two replicas (one, after a
fall of two). One return gap is then the time since the need fell below the count it came back to: how long a
replica released at that count would have idled before it was wanted again. Two choices, each measured on
bursty_conversation at a 60 s cold start (docs/benchmarks/autoscaling.md, "Return gaps timed per replica count"):
- timed from the fall's start, a dip of one replica at a burst's peak starts the clock while the burst still runs;
  and waiting for the need to come half the way back to the largest burst's level, a smaller next burst is no
  return at all: the old rule learned 1,140 s there for bursts 430-490 s apart;
- a return within `min_fall_s` (the release's confirmation) closes the fall unlearned: it released nothing, so it
  says nothing of a release's cost. On a burst's rise the need swings by replicas from pass to pass as the pending
  fleet takes the backlog, and a 5 s "return" learned there held each later burst's fleet for minutes.
The learned gap is the running mean of the gaps (the last weighted a half). A need that never comes back leaves its
fall open, and a late return then counts as a long gap, which is what it was.

The release reads it as an expected cost (`comes_back_within`): releasing a replica the need will want again costs
a re-order (`reorder_s`: one cold start billed, and the requests that miss their target while it starts, in
replica-seconds); keeping it costs the seconds it idles until then. So a fleet whose need came back sooner than a
re-order costs is released slowly, and one whose need came back later, or has not come back yet, promptly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReturnGap:
    fell_below: tuple[float, ...] = ()   # [i]: when the need first fell below level - i (empty: no fall open)
    level: int = 0                       # the fleet the need fell from
    gap_s: float | None = None           # the learned return gap
    returns: int = 0                     # falls that came back

    @property
    def bottom(self) -> int:
        """The lowest need since the fall opened."""
        return self.level - len(self.fell_below)

    def observe(self, now: float, current: int, keep_need: int, up_need: int, min_fall_s: float = 0.0) -> ReturnGap:
        """After a pass that saw the need to keep (`keep_need`) and to order (`up_need`) on `current` replicas."""
        if not self.fell_below:
            if keep_need < current:
                return ReturnGap((now,) * (current - keep_need), current, self.gap_s, self.returns)
            return self
        fell = self.fell_below + (now,) * max(0, self.level - keep_need - len(self.fell_below))
        depth = len(fell)
        bottom = self.level - depth
        if depth >= 2 and up_need - bottom >= min(2, (depth + 1) // 2):
            gap = now - fell[self.level - min(up_need, self.level)]   # since the need fell below where it is back
            if gap < min_fall_s:
                return self._closed()
            learned = gap if self.gap_s is None else (self.gap_s + gap) / 2
            return ReturnGap((), 0, learned, self.returns + 1)
        if depth < 2 and keep_need >= current:
            return self._closed()   # a dip of one replica, over: not a fall
        return ReturnGap(fell, self.level, self.gap_s, self.returns)

    def _closed(self) -> ReturnGap:
        """No fall open, nothing learned from the one that was."""
        return ReturnGap((), 0, self.gap_s, self.returns)

    def comes_back_within(self, reorder_s: float) -> bool:
        """Whether the need, after its falls so far, came back sooner than a re-order costs (`reorder_s`)."""
        return self.gap_s is not None and self.gap_s <= reorder_s

    def to_dict(self) -> dict:
        return {"fellBelow": list(self.fell_below), "level": self.level, "gapSeconds": self.gap_s,
                "returns": self.returns}

    @classmethod
    def from_dict(cls, data: dict | None) -> ReturnGap:
        if not data:
            return cls()
        fell = tuple(data.get("fellBelow", ()))
        if not fell and data.get("fellAt") is not None:   # kept by an operator before the per-count times
            fell = (data["fellAt"],) * (data.get("level", 0) - data.get("bottom", 0))
        return cls(fell, data.get("level", 0) if fell else 0, data.get("gapSeconds"), data.get("returns", 0))
