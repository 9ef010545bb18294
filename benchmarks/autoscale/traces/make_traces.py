"""Writes this folder's two request traces, in the public format of production LLM inference traces
(`TIMESTAMP,ContextTokens,GeneratedTokens`), made here with a fixed seed (no production data in them):

- `bursty_conversation.csv`: 40 minutes of a chat service: about 2 requests/s with four bursts of 4-8x lasting
  1-4 minutes, each rising over 20 s; prompts log-normal around 1,100 tokens, outputs around 210.
- `diurnal_code.csv`: 40 minutes standing for a compressed day of a code-completion service: a daily curve from
  0.6 to 4.5 requests/s with a random walk of +-30% on top; prompts around 2,000 tokens, outputs around 30.

    python benchmarks/autoscale/traces/make_traces.py
"""
import csv
import math
import random
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
START = datetime(2026, 11, 24, 9, 0, 0)
DURATION_S = 2400.0


def lognormal(rng: random.Random, mean: float, sigma: float, low: int, high: int) -> int:
    return int(min(high, max(low, rng.lognormvariate(math.log(mean) - sigma ** 2 / 2, sigma))))


def arrivals(rng: random.Random, rate, peak: float) -> list[float]:
    """A non-homogeneous Poisson process by thinning."""
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= DURATION_S:
            return out
        if rng.random() * peak <= rate(t):
            out.append(t)


def write(path: Path, times: list[float], lengths) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t in times:
            prompt, output = lengths()
            stamp = START + timedelta(seconds=t)
            writer.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{stamp.microsecond:06d}0", prompt, output])


def bursty(rng: random.Random) -> None:
    bursts = [(300.0, 6.0, 120.0), (900.0, 4.0, 240.0), (1500.0, 8.0, 60.0), (1980.0, 5.0, 180.0)]
    base = 2.0

    def rate(t: float) -> float:
        factor = 1.0
        for start, height, length in bursts:
            if start <= t < start + length:
                factor = max(factor, 1 + (height - 1) * min(1.0, (t - start) / 20.0))
        return base * factor

    times = arrivals(rng, rate, base * 8)
    write(HERE / "bursty_conversation.csv", times,
          lambda: (lognormal(rng, 1100, 0.9, 16, 8192), lognormal(rng, 210, 0.8, 1, 2048)))


def diurnal(rng: random.Random) -> None:
    walk, points = 0.0, []
    for _ in range(int(DURATION_S / 30) + 2):   # a step of the random walk every 30 s
        walk = max(-0.3, min(0.3, walk + rng.gauss(0, 0.06)))
        points.append(walk)

    def rate(t: float) -> float:
        day = 0.6 + (4.5 - 0.6) * (1 - math.cos(2 * math.pi * t / DURATION_S)) / 2
        return day * (1 + points[int(t // 30)])

    times = arrivals(rng, rate, 4.5 * 1.3)
    write(HERE / "diurnal_code.csv", times,
          lambda: (lognormal(rng, 2000, 0.5, 64, 8192), lognormal(rng, 30, 0.7, 1, 512)))


if __name__ == "__main__":
    bursty(random.Random(1))
    diurnal(random.Random(2))
