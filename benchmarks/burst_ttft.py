"""Time to first token of a burst, by the waiting queue's order: `shortest-first` against `fcfs`, engine only.

Every request of a burst arrives at once (as at the 64-stream level of `benchmarks/serve.py`), so each one's
time to first token is the time to prefill the prompts started before it. The policies alternate, each in a
fresh engine warmed up by one full step (which also measures the prefill rate that shortest-first ages by), on
a real model's shape (`--shape`, benchmarks/shapes.py; random weights) and fixed-seed token ids; greedy, ignore_eos. It prints each run's TTFT
P50/P95 and the burst's wall time, then the medians; the outputs of the two policies are compared token by token.

    python benchmarks/burst_ttft.py [--num-requests 64] [--min-prompt 256] [--max-prompt 768] [--output 128]
"""
import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from serve import quantile   # noqa: E402
from shapes import CPU_SHAPES, SHAPES, write_shape_dir   # noqa: E402
from shapes import describe as describe_shape   # noqa: E402
from throughput import ours_settings   # noqa: E402

POLICIES = ("shortest-first", "fcfs")
SETTINGS = ours_settings(None, load_format="dummy")   # benchmarks/throughput.py's engine settings


def run_burst(model: Path, policy: str, prompts: list[list[int]], output: int) -> dict:
    with LLM(str(model), scheduling_policy=policy, **SETTINGS) as llm:
        engine = llm.engine
        warm_up = [[1] * (SETTINGS["max_num_batched_tokens"] - 1)]
        llm.generate(warm_up, SamplingParams(max_tokens=1))
        params = SamplingParams(max_tokens=output, temperature=0, ignore_eos=True)
        arrival = time.monotonic()
        for index, prompt in enumerate(prompts):
            engine.add_request(str(index), prompt, params, arrival_time=arrival)
        first, tokens = {}, {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                first.setdefault(out.request_id, time.monotonic() - arrival)
                if out.finished:
                    tokens[out.request_id] = list(out.token_ids)
        wall = time.monotonic() - arrival
    ttft = list(first.values())
    return {"p50": quantile(ttft, 0.5), "p95": quantile(ttft, 0.95), "wall": wall,
            "tokens": [tokens[str(i)] for i in range(len(prompts))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=256)
    parser.add_argument("--max-prompt", type=int, default=768)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each policy")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0])
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_shape_dir(Path(tmp) / "model", args.shape)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))]
                   for _ in range(args.num_requests)]
        print(f"burst of {len(prompts)} requests at once, {sum(map(len, prompts))} prompt tokens "
              f"({args.min_prompt}-{args.max_prompt} each), {args.output} output tokens each; "
              f"model: {describe_shape(args.shape)}, fp32, CPU; kubeinfer: {SETTINGS}")
        runs: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
        for repeat in range(args.repeats):
            for policy in POLICIES:
                result = run_burst(model, policy, prompts, args.output)
                runs[policy].append(result)
                print(f"  run {repeat + 1} {policy:<15} TTFT P50 {result['p50'] * 1e3:7.0f} ms  P95 "
                      f"{result['p95'] * 1e3:7.0f} ms  burst {result['wall']:6.2f} s", flush=True)
    print(f"\n{'policy':<16}{'TTFT P50 ms':>12}{'TTFT P95 ms':>12}{'burst s':>9}   (medians of {args.repeats})")
    for policy, results in runs.items():
        med = lambda key: statistics.median(r[key] for r in results)   # noqa: E731
        print(f"{policy:<16}{med('p50') * 1e3:>12.0f}{med('p95') * 1e3:>12.0f}{med('wall'):>9.2f}")
    same = sum(a == b for a, b in zip(runs[POLICIES[0]][0]["tokens"], runs[POLICIES[1]][0]["tokens"]))
    print(f"greedy outputs, shortest-first vs fcfs: {same}/{len(prompts)} identical")


if __name__ == "__main__":
    main()
