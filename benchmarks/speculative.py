"""Speculative decoding by prompt lookup vs plain decoding, side by side in one run.

Three workloads, same lengths (prompts of 129-193 tokens, 60-92 tokens out):
- copy: the copy model of `benchmarks/copy_model.py` (trained once, cached), which copies passages it has
  seen, as models do when they edit code or quote a document; `A SEP A[:4]` -> the rest of A, greedy: where
  prompt lookup hits;
- unseen: the copy model on a random prompt, sampled at temperature 1 (seeded): it partly repeats itself, so
  lookup hits sometimes and is often wrong;
- random: the demo model (random weights: a near-uniform next token) on a random prompt, sampled at
  temperature 1: random text, where lookup finds next to nothing and speculation must not cost more than a
  few percent.
Each (workload, concurrency) runs plain and speculative engines alternately (which goes first alternates too),
`--trials` times each, with a
closed loop of `concurrency` requests in flight; figures are medians over trials. The copy workload is greedy, so
both modes must produce the same tokens (checked).

    python benchmarks/speculative.py [--concurrency 1 8 32] [--num-requests 32] [--trials 5] [--model PATH]

Per request, TPOT = (last token - first token) / (tokens - 1), the mean inter-token latency a client sees.
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from copy_model import SEPARATOR, copy_accuracy, copy_model, passage   # noqa: E402
from peers.machine import describe   # noqa: E402


def workloads(num: int, seed: int = 0) -> dict[str, tuple[str, list[tuple[list[int], SamplingParams]]]]:
    """name -> (model, requests)."""
    rng = random.Random(seed)
    passages = [passage(rng, rng.randint(64, 96)) for _ in range(num)]
    copy = [(a + [SEPARATOR] + a[:4], SamplingParams(max_tokens=len(a) - 4, temperature=0, ignore_eos=True))
            for a in passages]
    sampled = [(passage(rng, len(prompt)), SamplingParams(max_tokens=params.max_tokens, temperature=1.0, seed=i,
                                                          ignore_eos=True))
               for i, (prompt, params) in enumerate(copy)]
    return {"copy": ("copy", copy), "unseen": ("copy", sampled), "random": ("demo", sampled)}


def run(llm: LLM, requests: list[tuple[list[int], SamplingParams]], concurrency: int) -> dict:
    """A closed loop: `concurrency` requests in flight until all are done."""
    engine, pending = llm.engine, list(enumerate(requests))
    stats = engine.scheduler.stats
    before = (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
    first: dict[str, float] = {}
    tpots, tokens, in_flight = [], {}, 0
    started = time.perf_counter()
    while pending or in_flight:
        while pending and in_flight < concurrency:
            index, (prompt, params) = pending.pop(0)
            engine.add_request(str(index), prompt, params)
            in_flight += 1
        for output in engine.step():
            now = time.perf_counter()
            first.setdefault(output.request_id, now)
            if output.finished:
                in_flight -= 1
                tokens[int(output.request_id)] = output.token_ids
                if len(output.token_ids) > 1:
                    tpots.append((now - first[output.request_id]) / (len(output.token_ids) - 1))
    elapsed = time.perf_counter() - started
    drafts, draft_tokens, accepted = (after - b for after, b in zip(
        (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens), before))
    return {"tok_s": sum(map(len, tokens.values())) / elapsed, "tpot_ms": statistics.median(tpots) * 1e3,
            "tpot_p95_ms": sorted(tpots)[int(0.95 * (len(tpots) - 1))] * 1e3, "drafts": drafts,
            "draft_tokens": draft_tokens, "accepted": accepted, "tokens": [tokens[i] for i in sorted(tokens)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--speculative-tokens", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", help="a copy model's folder (default: benchmarks/copy_model.py's, trained once)")
    args = parser.parse_args()
    model = args.model or copy_model()
    print(f"# {describe()}, torch {torch.__version__}, "
          f"device {args.device}; copy model {model} (greedy copy accuracy {copy_accuracy(model):.1%})")
    engines = {}
    for name, path in (("copy", str(model)), ("demo", "demo")):
        engines[name] = {
            "plain": LLM(path, device=args.device, max_num_seqs=max(args.concurrency)),
            "ngram": LLM(path, device=args.device, max_num_seqs=max(args.concurrency),
                         speculative_method="ngram", speculative_tokens=args.speculative_tokens),
        }
        for llm in engines[name].values():   # warm-up
            llm.generate([[1, 2, 3, 1, 2, 3]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    print(f"{'workload':<8}{'conc':>5} | {'plain tok/s':>11}{'TPOT ms':>9}{'P95':>7} | {'ngram tok/s':>11}"
          f"{'TPOT ms':>9}{'P95':>7} | {'speed-up':>8}{'accept':>8}{'tok/step':>9}")
    for name, (model_name, requests) in workloads(args.num_requests).items():
        for concurrency in args.concurrency:
            results = {mode: [] for mode in ("plain", "ngram")}
            for trial in range(args.trials):
                order = ("plain", "ngram") if trial % 2 == 0 else ("ngram", "plain")   # no mode always first
                for mode in order:
                    results[mode].append(run(engines[model_name][mode], requests, concurrency))
            plain, ngram = (_median(results[mode]) for mode in ("plain", "ngram"))
            if name == "copy":
                assert results["plain"][0]["tokens"] == results["ngram"][0]["tokens"], "greedy outputs differ"
            accept = ngram["accepted"] / max(ngram["draft_tokens"], 1)
            per_step = 1 + ngram["accepted"] / max(ngram["drafts"], 1)
            print(f"{name:<8}{concurrency:>5} | {plain['tok_s']:>11.0f}{plain['tpot_ms']:>9.2f}"
                  f"{plain['tpot_p95_ms']:>7.2f} | {ngram['tok_s']:>11.0f}{ngram['tpot_ms']:>9.2f}"
                  f"{ngram['tpot_p95_ms']:>7.2f} | {ngram['tok_s'] / plain['tok_s']:>7.2f}x{accept:>8.1%}"
                  f"{per_step:>9.2f}", flush=True)


def _median(runs: list[dict]) -> dict:
    keys = ("tok_s", "tpot_ms", "tpot_p95_ms", "drafts", "draft_tokens", "accepted")
    return {key: statistics.median(run[key] for run in runs) for key in keys}


if __name__ == "__main__":
    main()
