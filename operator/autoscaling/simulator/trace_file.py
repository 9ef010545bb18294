"""Request traces from CSV files in the public format of production LLM inference traces:
`TIMESTAMP,ContextTokens,GeneratedTokens`, one request per row (the Azure LLM inference traces' format;
docs/autoscaling.md says where to get them).

TIMESTAMP is a date-time (`2023-11-16 18:15:46.6805900`, fractions of any length) or a number of seconds.
Each request keeps its own prompt and output length. Options: `compress_to_s` maps the trace's span onto that
many seconds (the rate rises by the same factor); `rate_scale` thins the requests (< 1) or adds copies of them
a little later (> 1), with a fixed seed.
"""

from __future__ import annotations

import csv
import math
import random
from bisect import bisect_left, bisect_right
from datetime import datetime
from pathlib import Path

from .sim import Trace

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
RATE_WINDOW_S = 30.0   # the rate a trace reports at t: requests in [t - w/2, t + w/2) over w


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    date, _, fraction = text.strip().partition(".")
    stamp = datetime.fromisoformat(date).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)


def read_requests(path: str | Path) -> list[tuple[float, int, int]]:
    """(seconds since the first request, prompt tokens, output tokens), sorted by arrival."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                rows.append((_seconds(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            except ValueError as error:
                raise ValueError(f"{path}:{line}: {error}") from None
    if not rows:
        raise ValueError(f"{path}: no requests")
    rows.sort()
    start = rows[0][0]
    return [(t - start, max(1, prompt), max(1, output)) for t, prompt, output in rows]


def load_trace(path: str | Path, compress_to_s: float | None = None, rate_scale: float = 1.0, seed: int = 0,
               name: str | None = None, max_prompt: int = 4096, max_output: int = 1024) -> Trace:
    """A `Trace` that replays the file's requests (lengths clipped to the simulator's limits)."""
    requests = read_requests(path)
    span = max(requests[-1][0], 1.0)
    factor = compress_to_s / span if compress_to_s else 1.0
    rng = random.Random(seed)
    out = []
    for t, prompt, output in requests:
        copies = int(rate_scale) + (1 if rng.random() < rate_scale - int(rate_scale) else 0)
        for copy in range(copies):   # copies land up to a second later: the same burst, not the same instant
            out.append((t * factor + (rng.random() if copy else 0.0), min(prompt, max_prompt), min(output, max_output)))
    out.sort()
    duration = span * factor
    arrivals = [t for t, _, _ in out]

    def rate(t: float) -> float:
        lo, hi = t - RATE_WINDOW_S / 2, t + RATE_WINDOW_S / 2
        return (bisect_left(arrivals, hi) - bisect_right(arrivals, lo - 1e-12)) / RATE_WINDOW_S

    peak = max((rate(i * RATE_WINDOW_S / 2) for i in range(int(duration / (RATE_WINDOW_S / 2)) + 2)), default=0.0)
    label = name or Path(path).stem
    if compress_to_s or rate_scale != 1.0:
        label += f" (x{rate_scale:g} rate, {duration:.0f} s)"
    return Trace(label, math.ceil(duration), rate, peak, requests=tuple(out),
                 lengths=tuple((p, o) for _, p, o in out))
