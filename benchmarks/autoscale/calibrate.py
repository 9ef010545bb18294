"""Fit the simulator's replica model (`sim.ReplicaModel`) to the real runtime's engine steps.

    .venv/bin/python benchmarks/autoscale/calibrate.py [--model demo] [--cpu-threads 1] [--steps 20] [--repeats 3]

The simulator prices an engine step as decode_base + decode_per_seq * running + prefill_per_token *
admitted prompt tokens. This times `LLMEngine.step()` on a real model (default: the built-in CPU demo
model) for decode batches of 1..32 sequences and for prefills of 128..768 tokens, and prints a
`ReplicaModel(...)`: the decode constants by least squares (decode steps are linear in the batch), the
prefill cost per token as measured at the simulator's mean prompt (512 tokens): prefill on the CPU
reference path grows faster than linearly with the prompt (attention), which one per-token constant
cannot hold, so the printed per-length costs say how far it is off. Short: ~30 s on one CPU core.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

DECODE_BATCHES = (1, 4, 8, 16, 32)
PREFILL_TOKENS = (128, 256, 384, 512, 768)
MEAN_PROMPT = 512  # sim.Trace.prompt_mean


_rng = random.Random(0)


def _prompt(n: int) -> list[int]:
    """Random token ids (prefix caching is off as well: every prefill computes all its tokens)."""
    return [_rng.randrange(3, 500) for _ in range(n)]


def decode_step_seconds(llm: LLM, batch: int, steps: int, tag: int) -> float:
    """Median step time with `batch` sequences decoding (prompts of 16 tokens, prefilled untimed)."""
    for i in range(batch):
        llm.engine.add_request(f"d{tag}-{i}", _prompt(16),
                               SamplingParams(max_tokens=steps + 4, ignore_eos=True, temperature=0))
    llm.engine.step()  # the prefill
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        llm.engine.step()
        times.append(time.perf_counter() - t0)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    return statistics.median(times)


def prefill_step_seconds(llm: LLM, tokens: int, repeats: int, tag: int) -> float:
    """Median time of one step that prefills a single prompt of `tokens` tokens."""
    times = []
    for r in range(repeats):
        llm.engine.add_request(f"p{tag}-{r}", _prompt(tokens),
                               SamplingParams(max_tokens=1, ignore_eos=True, temperature=0))
        t0 = time.perf_counter()
        llm.engine.step()
        times.append(time.perf_counter() - t0)
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    return statistics.median(times)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per batch size")
    ap.add_argument("--cpu-threads", type=int, default=1,
                    help="torch threads (the operator gives a CPU pod as many as CPUs it requests; 1 is also "
                         "the steadiest figure on a shared machine)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="measure every point this many times and keep the fastest (a shared machine only adds time)")
    args = ap.parse_args(argv)
    llm = LLM(args.model, max_num_seqs=max(DECODE_BATCHES), max_num_batched_tokens=max(PREFILL_TOKENS) + 64,
              enable_prefix_caching=False, cpu_threads=args.cpu_threads)
    decode_step_seconds(llm, 4, 2, tag=999)  # warm-up
    decode = [min(decode_step_seconds(llm, b, args.steps, tag=b + 100 * r) for r in range(args.repeats))
              for b in DECODE_BATCHES]
    prefill = [min(prefill_step_seconds(llm, n, 3, tag=n + 10_000 * r) for r in range(args.repeats))
               for n in PREFILL_TOKENS]
    base, per_seq = fit_line(list(DECODE_BATCHES), decode)
    per_token = prefill[PREFILL_TOKENS.index(MEAN_PROMPT)] / MEAN_PROMPT
    for b, s in zip(DECODE_BATCHES, decode):
        print(f"decode  batch {b:>4}: {1000 * s:7.2f} ms/step")
    for n, s in zip(PREFILL_TOKENS, prefill):
        print(f"prefill {n:>4} tok: {1000 * s:7.2f} ms/step = {1000 * s / n:.3f} ms/token")
    print(f"fit: decode {1000 * base:.2f} ms + {1000 * per_seq:.3f} ms/seq; prefill {1000 * per_token:.3f} ms/token "
          f"(at {MEAN_PROMPT} tokens)")
    print(f"ReplicaModel(decode_base_s={base:.5f}, decode_per_seq_s={per_seq:.6f}, "
          f"prefill_s_per_token={per_token:.7f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
