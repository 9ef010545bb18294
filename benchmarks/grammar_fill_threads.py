"""How llguidance's bitmask fill scales with threads, at one batch: its own pool (`LLExecutor(num_threads)`) against
our threads each filling a chunk of the batch through a one-thread pool, for matchers built fresh and for deep copies
of one template (what the engine's grammar cache hands out). The matchers walk random valid paths through one JSON
schema (grammar_libraries.SCHEMA) on a byte-level BPE of `--vocab` tokens; the median fill per step is printed.

    python benchmarks/grammar_fill_threads.py [--batch 256] [--vocab 32000] [--threads 1 4 16]
"""
import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llguidance
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_libraries import SCHEMA, big_tokenizer  # noqa: E402


def fill_pool(executor, matchers, mask, words):
    executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], mask.data_ptr(), words * 4,
                                     mask.shape[0])


def fill_chunks(pool, executors, matchers, mask, words):
    chunk = -(-len(matchers) // len(executors))

    def one(index):
        start = index * chunk
        executors[index].unsafe_compute_mask_ptr([(m, start + i) for i, m in enumerate(matchers[start:start + chunk])],
                                                 mask.data_ptr(), words * 4, mask.shape[0])
    list(pool.map(one, range(len(executors))))


def walk(make, fill, batch: int, vocab: int, steps: int) -> float:
    """Median ms of `fill` over `steps` steps, each matcher then taking a random allowed token."""
    words = (vocab + 31) // 32
    matchers, generator = [make() for _ in range(batch)], torch.Generator().manual_seed(0)
    mask = torch.empty(batch, words, dtype=torch.int32)
    shifts = torch.arange(32, dtype=torch.int32)
    times = []
    for _ in range(steps):
        mask.fill_(-1)
        started = time.perf_counter()
        fill(matchers, mask, words)
        times.append(time.perf_counter() - started)
        allowed = ((mask.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab].float()
        allowed[allowed.sum(1) == 0, 0] = 1.0   # a stopped matcher's row: any token, not consumed
        choices = torch.multinomial(allowed, 1, generator=generator).flatten().tolist()
        for matcher, token in zip(matchers, choices):
            if not matcher.is_stopped():
                matcher.consume_token(token)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    tokenizer = big_tokenizer(args.vocab)
    vocab = tokenizer.get_vocab_size()
    lltok = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab, eos_token=[0])
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    template = llguidance.LLMatcher(lltok, grammar)
    makers = {"fresh": lambda: llguidance.LLMatcher(lltok, grammar), "deep copies": template.deep_copy}
    print(f"batch {args.batch}, vocab {vocab}, {os.cpu_count()} CPUs; median fill ms over {args.steps} steps")
    print("| matchers | threads | llguidance's pool | our threads, a chunk each |\n|---|---|---|---|")
    for name, make in makers.items():
        for threads in args.threads:
            executor = llguidance.LLExecutor(num_threads=threads)
            pooled = walk(make, lambda m, mask, w: fill_pool(executor, m, mask, w), args.batch, vocab, args.steps)
            executors = [llguidance.LLExecutor(num_threads=1) for _ in range(threads)]
            with ThreadPoolExecutor(threads) as pool:
                chunked = walk(make, lambda m, mask, w: fill_chunks(pool, executors, m, mask, w), args.batch, vocab,
                               args.steps)
            print(f"| {name} | {threads} | {pooled:.2f} | {chunked:.2f} |", flush=True)


if __name__ == "__main__":
    main()
