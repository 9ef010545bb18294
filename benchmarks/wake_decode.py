"""A level-1 wake on the CPU by mapping the sleep file against copying it (docs/runtime.md, "Sleep"): the wake's
seconds and the decode speed afterwards, alternated in one process so that drift falls on both.

    python -P benchmarks/wake_decode.py [--model smollm2-135m-instruct] [--cycles 4] [--batch 8] [--tokens 96]

Each cycle sleeps at level 1 and wakes once each way (`KUBEINFER_SLEEP_WAKE=copy|map`, order alternating by cycle),
then times two greedy generations of `--batch` prompts x `--tokens` tokens: the first pays the mapped pages' first
reads, the second is steady.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers.machine import describe  # noqa: E402

from kubeinfer.runtime.llm import LLM  # noqa: E402
from kubeinfer.runtime.sampling_params import SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    print(describe())
    llm = LLM(args.model, kv_cache_memory_gib=0.5)
    prompts = [f"Write a long story about cluster number {i}:" for i in range(args.batch)]
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)

    def generation_seconds() -> float:
        started = time.perf_counter()
        llm.generate(prompts, params)
        return time.perf_counter() - started
    generation_seconds()   # warm
    figures = {"copy": [], "map": []}
    for cycle in range(args.cycles):
        for mode in ("copy", "map") if cycle % 2 == 0 else ("map", "copy"):
            os.environ["KUBEINFER_SLEEP_WAKE"] = mode
            llm.sleep(1)
            started = time.perf_counter()
            llm.wake_up()
            wake = time.perf_counter() - started
            figures[mode].append((wake, generation_seconds(), generation_seconds()))
            print(f"cycle {cycle + 1} {mode}: wake {wake:.3f} s, first generation {figures[mode][-1][1]:.3f} s, "
                  f"second {figures[mode][-1][2]:.3f} s", flush=True)
    print(f"\nmedians of {args.cycles} ({args.batch} x {args.tokens} tokens)\n| wake | wake s | first generation s | "
          "second generation s |\n|---|---|---|---|")
    for mode, rows in figures.items():
        print(f"| {mode} | " + " | ".join(f"{statistics.median(r[i] for r in rows):.3f}" for i in range(3)) + " |")


if __name__ == "__main__":
    main()
