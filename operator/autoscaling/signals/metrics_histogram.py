"""Prometheus histogram arithmetic, done the way PromQL does it, so the direct-scrape source and the
simulator compute exactly what `histogram_quantile` returns on Prometheus.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

# Bucket bounds for kubeinfer_time_to_first_token_seconds, fine enough to read a P95 of tens of
# milliseconds and wide enough for queueing seconds (the runtime should use these).
TTFT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, math.inf,
)

# The runtime's bounds of the prompt and generated tokens per request (kubeinfer.runtime.server.metrics; the
# calibration reads them, the simulator exports them): named again here, the operator's image has no runtime.
PROMPT_TOKEN_BUCKETS = tuple(range(128, 4097, 128)) + (5120, 6144, 7168, 8192, 12288, 16384, 32768, 65536, 131072)
GENERATION_TOKEN_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                            4096, 8192, 16384, 32768)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Quantile from cumulative buckets `(upper_bound, cumulative_count)`, as PromQL's
    histogram_quantile: linear interpolation inside the bucket that holds the rank, 0 as the lower
    bound of the first bucket, and the highest finite bound when the rank falls in +Inf.
    None when there are no observations (PromQL gives NaN)."""
    pairs = sorted(buckets)
    if len(pairs) < 2 or not math.isinf(pairs[-1][0]):
        return None
    total = pairs[-1][1]
    if total <= 0:
        return None
    if q <= 0:
        return -math.inf
    if q >= 1:
        return math.inf
    rank = q * total
    counts = [c for _, c in pairs]
    b = bisect.bisect_left(counts, rank)
    if b == len(pairs) - 1:
        return pairs[-2][0]
    upper, count = pairs[b]
    if b == 0:
        if upper <= 0:
            return upper
        lower, count_before = 0.0, 0.0
    else:
        lower, count_before = pairs[b - 1]
    if count == count_before:
        return upper
    return lower + (upper - lower) * (rank - count_before) / (count - count_before)


def cumulative_counts(observations: Iterable[float], bounds: Sequence[float] = TTFT_BUCKETS) -> list[tuple[float, float]]:
    """Bucket raw observations into cumulative `(le, count)` pairs (what a client library exports)."""
    per_bucket = [0] * len(bounds)
    for v in observations:
        per_bucket[bisect.bisect_left(bounds, v)] += 1
    out, running = [], 0
    for le, n in zip(bounds, per_bucket):
        running += n
        out.append((le, float(running)))
    return out


def bucket_of(value: float, bounds: Sequence[float] = TTFT_BUCKETS) -> tuple[float, float]:
    """(lower, upper] bounds of the bucket that holds `value`."""
    i = bisect.bisect_left(bounds, value)
    return (0.0 if i == 0 else bounds[i - 1], bounds[i])
