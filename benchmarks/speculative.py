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

On a GPU (`--device cuda`) speculative steps replay CUDA graphs (each chunk padded to k + 1 tokens,
runtime/engine/cuda_graphs.py); `ngram-eager` runs the same engine with its verify steps eager, as before those
graphs, side by side. `--draft` adds the draft-model method with the model drafting for itself (`draft`; on a GPU
also `draft-eager`, its verify and draft forwards eager): every greedy draft is accepted, so it shows what a draft
forward costs against what it saves.
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
    parser.add_argument("--draft", action="store_true", help="also the draft-model method (the model drafting for "
                                                             "itself)")
    args = parser.parse_args()
    model = args.model or copy_model()
    print(f"# {describe()}, torch {torch.__version__}, "
          f"device {args.device}; copy model {model} (greedy copy accuracy {copy_accuracy(model):.1%})")
    modes = ["plain", "ngram"] + (["ngram-eager"] if args.device == "cuda" else [])
    if args.draft:
        modes += ["draft"] + (["draft-eager"] if args.device == "cuda" else [])
    engines = {name: {mode: _engine(path, mode, args) for mode in modes}
               for name, path in (("copy", str(model)), ("demo", "demo"))}
    print(f"{'workload':<8}{'conc':>5}  {'mode':<12}| {'tok/s':>7}{'TPOT ms':>9}{'P95':>7} | {'vs plain':>8}"
          f"{'accept':>8}{'tok/step':>9}")
    for name, (model_name, requests) in workloads(args.num_requests).items():
        for concurrency in args.concurrency:
            results = {mode: [] for mode in modes}
            for trial in range(args.trials):
                order = modes[trial % len(modes):] + modes[:trial % len(modes)]   # no mode always first
                for mode in order:
                    results[mode].append(run(engines[model_name][mode], requests, concurrency))
            if name == "copy":
                for mode in modes[1:]:
                    assert results[mode][0]["tokens"] == results["plain"][0]["tokens"], f"greedy outputs differ: {mode}"
            plain = _median(results["plain"])
            for mode in modes:
                figures = _median(results[mode])
                accept = figures["accepted"] / max(figures["draft_tokens"], 1)
                per_step = 1 + figures["accepted"] / max(figures["drafts"], 1)
                print(f"{name:<8}{concurrency:>5}  {mode:<12}| {figures['tok_s']:>7.0f}{figures['tpot_ms']:>9.2f}"
                      f"{figures['tpot_p95_ms']:>7.2f} | {figures['tok_s'] / plain['tok_s']:>7.2f}x"
                      + (f"{accept:>8.1%}{per_step:>9.2f}" if mode != "plain" else ""), flush=True)


def _engine(path: str, mode: str, args) -> LLM:
    """An engine of `mode`: plain, ngram, draft (the model drafting for itself), or either with `-eager`
    speculative steps (its CUDA graphs for verify and draft forwards dropped; plain decode steps keep theirs)."""
    settings = {}
    if mode.startswith("ngram"):
        settings = {"speculative_method": "ngram", "speculative_tokens": args.speculative_tokens}
    elif mode.startswith("draft"):
        settings = {"speculative_method": "draft", "speculative_model": path,
                    "speculative_tokens": args.speculative_tokens}
    llm = LLM(path, device=args.device, max_num_seqs=max(args.concurrency), **settings)
    if mode.endswith("-eager"):
        runner = llm.engine.model_runner
        runner.verify_graphs = None
        if runner.draft is not None:
            runner.draft.graphs = runner.draft.chunk_graphs = None
    llm.generate([[1, 2, 3, 1, 2, 3]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))   # warm-up
    return llm


def _median(runs: list[dict]) -> dict:
    keys = ("tok_s", "tpot_ms", "tpot_p95_ms", "drafts", "draft_tokens", "accepted")
    return {key: statistics.median(run[key] for run in runs) for key in keys}


if __name__ == "__main__":
    main()
