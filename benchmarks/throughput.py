"""Offline throughput: ours against vLLM's CPU build (or transformers.generate), same model, same token ids.

Models: `--shape` names a real model's config with random weights (benchmarks/shapes.py: smollm2-135m, the default,
qwen2.5-0.5b, llama-3.2-1b; `toy` is the first benchmarks' 4-layer model, a smoke option only), loaded by both engines
with `load_format="dummy"`; `--model` takes a model folder or name instead (e.g. `smollm2-135m-instruct`, the real
trained model), whose greedy outputs the engines must then agree on.

Workloads (fixed seed), like `vllm bench throughput`: random prompt tokens, mixed lengths, ignore_eos.
- `short` (the default): 64 requests, prompts 32-512 tokens, outputs 16-256.
- `long`: 64 requests, prompts 128-1024 tokens, outputs 256-512.

Each engine warms up on the first two requests, then runs every request twice: first on prompts it has not
seen (the figure compared), then on the same prompts again, when every prefix is in its cache (reported beside).
With `--peer vllm` the engines alternate, `--repeats` times each, on the same model folder and token ids;
vLLM runs in its own venv (benchmarks/peers/vllm_env.py creates it on first use), in the configurations of
`--vllm-configs`. Greedy outputs are compared token by token (fp32 both; a random model's near-ties may differ).

    python -P benchmarks/throughput.py [--shape smollm2-135m] [--workload short|long] [--peer vllm|transformers|none]
                                       [--repeats 3]
"""
import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from peers import vllm_env   # noqa: E402
from peers.on_kill import exit_on_sigterm   # noqa: E402
from peers.machine import describe   # noqa: E402
from shapes import CPU_SHAPES, SHAPES, model_folder   # noqa: E402
from shapes import describe as describe_shape   # noqa: E402

WORKLOADS = {"short": ((32, 512), (16, 256)), "long": ((128, 1024), (256, 512)), "prefill": ((256, 1024), (1, 1))}
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, MAX_MODEL_LEN = 256, 2048, 4096


def workload(num: int, vocab: int, seed: int = 0, name: str = "short"):
    (prompt_lo, prompt_hi), (out_lo, out_hi) = WORKLOADS[name]
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(prompt_lo, prompt_hi))] for _ in range(num)]
    outputs = [rng.randint(out_lo, out_hi) for _ in range(num)]
    return prompts, outputs


def ours_settings(threads: int | None, dtype: str = "float32", load_format: str = "auto",
                  kv_cache_gib: float | None = vllm_env.KV_CACHE_GIB) -> dict:
    return dict(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_model_len=MAX_MODEL_LEN,
                kv_cache_memory_gib=kv_cache_gib, cpu_threads=threads, dtype=dtype, load_format=load_format)


def run_ours(model: Path, prompts, outputs, settings: dict) -> dict:
    """A fresh engine: warm-up, then both passes."""
    with LLM(str(model), **settings) as llm:
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in outputs]
        llm.generate(prompts[:2], params[:2])   # warm-up
        passes, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(2):
            started = time.perf_counter()
            results = llm.generate(prompts, params)
            passes.append(time.perf_counter() - started)
            assert [len(r.token_ids) for r in results] == outputs
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"seconds": passes[0], "cached_seconds": passes[1], "tokens": [list(r.token_ids) for r in results],
            "page_faults": faults // 2}


def run_vllm(python: Path, model: Path, prompts, outputs, config: str, workdir: Path, dtype: str = "float32",
             load_format: str = "auto", kv_cache_gib: float | None = vllm_env.KV_CACHE_GIB) -> dict:
    settings = {"dtype": dtype, "max_model_len": MAX_MODEL_LEN, "seed": 0, "load_format": load_format}
    if config == "best":
        settings |= {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
    spec = workdir / "vllm-workload.json"
    spec.write_text(json.dumps({"model": str(model), "prompts": prompts, "outputs": outputs, "settings": settings}))
    log = workdir / f"vllm-{config}.log"
    with log.open("w") as out:
        done = subprocess.run([str(python), str(Path(__file__).parent / "peers" / "vllm_offline.py"), str(spec)],
                              env=vllm_env.environment(config, kv_cache_gib), stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"vLLM ({config}) failed, exit {done.returncode}:\n" + log.read_text()[-3000:])
    return json.loads(lines[-1][len("RESULT "):])


def run_transformers(model: Path, prompts, outputs, batch_size: int = 16) -> dict:
    """transformers.generate in padded batches (left padding), each up to its longest requested output."""
    import transformers as tf
    hf = tf.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hf.generate(torch.tensor([prompts[0][:8]]), max_new_tokens=2, do_sample=False, pad_token_id=0)   # warm-up
    started = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        batch, wanted = prompts[start:start + batch_size], outputs[start:start + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(wanted), min_new_tokens=max(wanted),
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        assert out.shape[1] == width + max(wanted)
    return {"seconds": time.perf_counter() - started}


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """How far the greedy outputs agree: identical requests, and the mean identical prefix."""
    same = sum(a == b for a, b in zip(ours, theirs))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ours, theirs)]
    return f"{same}/{len(ours)} identical, mean identical prefix {statistics.mean(prefix):.0f} tokens"


def main() -> None:
    exit_on_sigterm()   # `kill` stops what it started (the finally blocks, subprocess.run's child)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--peer", choices=("vllm", "transformers", "none"), default="vllm")
    parser.add_argument("--vllm-venv", type=Path, default=vllm_env.DEFAULT_VENV,
                        help="vLLM's venv (created there when missing)")
    parser.add_argument("--vllm-configs", nargs="+", choices=("best", "defaults"), default=["best", "defaults"])
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each engine")
    parser.add_argument("--threads", type=int, default=None, help="our torch threads (default: every CPU)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0],
                        help="a real model's shape with random weights (benchmarks/shapes.py)")
    parser.add_argument("--model", help="a model folder or name (smollm2-135m-instruct: the trained model) instead")
    parser.add_argument("--kv-cache-gib", type=float, default=vllm_env.KV_CACHE_GIB,
                        help="both engines' KV cache; 0 leaves ours to its default sizing")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="both engines' weights and activations (ours keeps an fp32 KV cache on the CPU)")
    parser.add_argument("--kv-prefault", action="store_true",
                        help="ours commits its KV pool at start-up, as vLLM's allocation does (ours: as it fills)")
    args = parser.parse_args()
    torch.manual_seed(0)
    python = vllm_env.ensure_venv(args.vllm_venv) if args.peer == "vllm" else None
    with tempfile.TemporaryDirectory() as tmp:
        model, load_format = model_folder(Path(tmp), args.shape, args.model)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        settings = ours_settings(args.threads, args.dtype, load_format, args.kv_cache_gib or None)
        settings |= {"kv_prefault": True} if args.kv_prefault else {}
        prompts, outputs = workload(args.num_requests, vocab, name=args.workload)
        prompt_tokens, output_tokens = sum(map(len, prompts)), sum(outputs)
        print(f"machine: {describe()}, torch {torch.__version__}; "
              f"model: {model if args.model else describe_shape(args.shape)}, {args.dtype}, CPU")
        print(f"workload {args.workload}: {len(prompts)} requests, {prompt_tokens} prompt + {output_tokens} output tokens")
        print(f"kubeinfer: {settings}, kernel backend auto (native CPU attention)")
        engines = ["kubeinfer"]
        if args.peer == "vllm":
            engines += [f"vllm-{config}" for config in args.vllm_configs]
            for config in args.vllm_configs:
                print(f"vllm-{config}: {vllm_env.describe(config, args.kv_cache_gib or None)}")
        elif args.peer == "transformers":
            engines += ["transformers"]
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for repeat in range(args.repeats):
            for name in engines:
                if name == "kubeinfer":
                    result = run_ours(model, prompts, outputs, settings)
                elif name == "transformers":
                    result = run_transformers(model, prompts, outputs)
                else:
                    result = run_vllm(python, model, prompts, outputs, name.removeprefix("vllm-"), Path(tmp),
                                      args.dtype, load_format, args.kv_cache_gib or None)
                runs[name].append(result)
                cached = f", prefixes cached {result['cached_seconds']:.2f} s" if "cached_seconds" in result else ""
                faults = f", {result['page_faults']:,} minor page faults a pass" if "page_faults" in result else ""
                print(f"  run {repeat + 1} {name:<16} {result['seconds']:6.2f} s{cached}{faults}", flush=True)
    print(f"\n{'engine':<18}{'median s':>9}{'runs':>22}{'output tok/s':>14}{'total tok/s':>13}{'cached s':>10}")
    medians = {}
    for name, results in runs.items():
        seconds = [r["seconds"] for r in results]
        medians[name] = statistics.median(seconds)
        cached = [r["cached_seconds"] for r in results if "cached_seconds" in r]
        print(f"{name:<18}{medians[name]:>9.2f}{' / '.join(f'{s:.2f}' for s in seconds):>22}"
              f"{output_tokens / medians[name]:>14.1f}{(prompt_tokens + output_tokens) / medians[name]:>13.1f}"
              f"{statistics.median(cached) if cached else float('nan'):>10.2f}")
    for name in engines[1:]:
        print(f"kubeinfer vs {name}: {medians[name] / medians['kubeinfer']:.2f}x "
              f"({'faster' if medians[name] > medians['kubeinfer'] else 'slower'})")
        if "tokens" in runs[name][0] and load_format != "dummy":   # dummy weights: each engine draws its own
            print(f"  greedy outputs vs {name}: {agreement(runs['kubeinfer'][0]['tokens'], runs[name][0]['tokens'])}")


if __name__ == "__main__":
    main()
