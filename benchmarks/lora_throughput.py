"""LoRA adapters against the base model alone, offline, in one run: the same requests spread over 1, 4 and 16
distinct adapters (every projection adapted, rank `--rank`), with the base model's throughput beside them, and how
long an adapter takes to load.

The model: throughput.py's (hidden 512, 4 layers, random weights, fp32). Adapters: random PEFT folders (A and B
random, so the update is real work, written here, no peft needed). The workload: throughput.py's `short` one at
`--num-requests`. Each configuration runs on a fresh engine with `max_loras` = the adapters in use, after a warm-up;
configurations alternate base / adapters `--repeats` times and the median is shown. The hardware limit of the extra
work: the update's FLOPs per token (2 x rank x (in + out) per projection) over the base model's.

    python benchmarks/lora_throughput.py [--adapters 1 4 16] [--rank 16] [--num-requests 64] [--repeats 2]
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402
from throughput import build_model, ours_settings, workload   # noqa: E402

from kubeinfer.runtime.llm import LLM   # noqa: E402
from kubeinfer.runtime.lora.adapter import module_shapes   # noqa: E402
from kubeinfer.runtime.models.config import ModelConfig   # noqa: E402
from kubeinfer.runtime.sampling_params import SamplingParams   # noqa: E402

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(folder: Path, config: ModelConfig, rank: int, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for module, (d_in, d_out) in module_shapes(config, layer).items():
            key = f"base_model.model.model.layers.{layer}.{'self_attn' if module in MODULES[:4] else 'mlp'}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) / d_in ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) / rank ** 0.5 * 0.1
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank,
                                                            "target_modules": list(MODULES)}))
    return folder


def run(model: Path, adapters: dict[str, str], prompts, outputs, rank: int = 16) -> float:
    settings = ours_settings(None) | ({"max_loras": len(adapters), "max_lora_rank": rank} if adapters else {})
    with LLM(str(model), **settings) as llm:
        for name, path in adapters.items():
            llm.load_lora(name, path)
        names = list(adapters) or [None]
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, lora_name=names[i % len(names)])
                  for i, n in enumerate(outputs)]
        llm.generate(prompts[:len(names)], params[:len(names)])   # warm-up: every adapter in its slot once
        started = time.perf_counter()
        llm.generate(prompts, params)
        return sum(outputs) / (time.perf_counter() - started)


def extra_flops_share(config: ModelConfig, rank: int) -> float:
    base = update = 0
    for layer in range(config.num_layers):
        for d_in, d_out in module_shapes(config, layer).values():
            base += 2 * d_in * d_out
            update += 2 * rank * (d_in + d_out)
    return update / base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"# {describe()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", 512, 4)
        config = ModelConfig.from_dir(str(model))
        prompts, outputs = workload(args.num_requests, config.vocab_size)
        folders = {f"a{i}": str(write_adapter(Path(tmp) / f"a{i}", config, args.rank, i))
                   for i in range(max(args.adapters))}
        with LLM(str(model), max_loras=1, max_lora_rank=args.rank) as llm:
            started = time.perf_counter()
            llm.load_lora("a0", folders["a0"])
            load_s = time.perf_counter() - started
            started = time.perf_counter()
            llm.generate([1, 2, 3], SamplingParams(max_tokens=1, lora_name="a0"))
            first_s = time.perf_counter() - started
        print(f"adapter of rank {args.rank} on every projection: read and checked in {load_s * 1e3:.1f} ms; first "
              f"request on it (slot filled, one prefill) {first_s * 1e3:.1f} ms; update FLOPs "
              f"{extra_flops_share(config, args.rank):.1%} of the base model's per token")
        print(f"\n{args.num_requests} requests, {sum(outputs)} output tokens, median of {args.repeats}")
        print("| adapters in the batch | base tok/s | with adapters tok/s | share of base |\n|---|---|---|---|")
        for count in args.adapters:
            adapters = {name: folders[name] for name in list(folders)[:count]}
            base, lora = [], []
            for _ in range(args.repeats):
                base.append(run(model, {}, prompts, outputs))
                lora.append(run(model, adapters, prompts, outputs, args.rank))
            b, a = statistics.median(base), statistics.median(lora)
            print(f"| {count} | {b:.0f} | {a:.0f} | {a / b:.0%} |", flush=True)


if __name__ == "__main__":
    main()
