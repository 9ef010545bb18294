"""Offline throughput of a mixture-of-experts model on the CPU: ours (one rank; two ranks with expert parallelism,
attention split over them or replicated on each) against transformers.generate, same random-weight checkpoint,
same token ids, one run.

The model: Qwen3-MoE shaped (hidden 512, 4 layers, 8 query / 4 KV heads of 64, 16 experts of 384, top-2,
renormalized), random weights, fp32. The workload: throughput.py's `short` one at `--num-requests` (default 32).
Each engine warms up first; greedy outputs are compared token by token.

    python benchmarks/moe_throughput.py [--num-requests 32] [--skip-transformers]
"""
import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402
from throughput import agreement, run_transformers, workload   # noqa: E402

from kubeinfer.runtime.demo import save_tokenizer, train_tokenizer   # noqa: E402
from kubeinfer.runtime.llm import LLM   # noqa: E402
from kubeinfer.runtime.sampling_params import SamplingParams   # noqa: E402

SHAPE = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=384,
             norm_topk_prob=True, max_position_embeddings=4096)


def build_moe_model(path: Path) -> Path:
    import transformers as tf
    tokenizer = train_tokenizer(vocab_size=1024)
    torch.manual_seed(0)
    config = tf.Qwen3MoeConfig(vocab_size=tokenizer.get_vocab_size(), tie_word_embeddings=False, **SHAPE)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def run_ours(model: Path, prompts, outputs, **settings) -> dict:
    with LLM(str(model), max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=4096, kv_cache_memory_gib=2,
             **settings) as llm:
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in outputs]
        llm.generate(prompts[:2], params[:2])   # warm-up
        started = time.perf_counter()
        results = llm.generate(prompts, params)
        seconds = time.perf_counter() - started
        load = llm.engine.core.stats()
    return {"seconds": seconds, "tokens": [list(r.token_ids) for r in results],
            "imbalance": load.expert_imbalance}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_moe_model(Path(tmp) / "moe")
        vocab = __import__("json").loads((model / "config.json").read_text())["vocab_size"]
        prompts, outputs = workload(args.num_requests, vocab, name="short")
        print(f"machine: {describe()}, torch {torch.__version__}")
        print(f"model: Qwen3-MoE {SHAPE}, fp32, random weights")
        print(f"workload: {len(prompts)} requests, {sum(map(len, prompts))} prompt + {sum(outputs)} output tokens")
        runs = {}
        for name, settings in (("kubeinfer EP=1", {}),
                               ("kubeinfer EP=2", {"tensor_parallel_size": 2, "expert_parallel_size": 2}),
                               ("kubeinfer EP=2 rep", {"expert_parallel_size": 2})):
            runs[name] = run_ours(model, prompts, outputs, **settings)
            print(f"  {name:<18} {runs[name]['seconds']:7.2f} s   load imbalance {runs[name]['imbalance']:.2f}",
                  flush=True)
        if not args.skip_transformers:
            runs["transformers"] = run_transformers(model, prompts, outputs)
            print(f"  {'transformers':<16} {runs['transformers']['seconds']:7.2f} s", flush=True)
    output_tokens = sum(outputs)
    print(f"\n{'engine':<20}{'seconds':>9}{'output tok/s':>14}")
    for name, result in runs.items():
        print(f"{name:<20}{result['seconds']:>9.2f}{output_tokens / result['seconds']:>14.1f}")
    base = runs["kubeinfer EP=1"]
    for name in ("kubeinfer EP=2", "kubeinfer EP=2 rep"):
        print(f"{name}: {base['seconds'] / runs[name]['seconds']:.2f}x the throughput of EP=1")
    if "transformers" in runs:
        print(f"kubeinfer EP=1: {runs['transformers']['seconds'] / base['seconds']:.2f}x the throughput of transformers")
    for name in ("kubeinfer EP=2", "kubeinfer EP=2 rep"):
        print(f"greedy outputs, {name} vs EP=1: {agreement(runs[name]['tokens'], base['tokens'])}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
