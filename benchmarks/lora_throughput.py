"""LoRA adapters against the base model alone, offline, in one run: the same requests spread over 1, 4 and 16
distinct adapters (every projection adapted, rank `--rank`), with the base model's throughput beside them, and how
long an adapter takes to load.

The model: throughput.py's (hidden 512, 4 layers, random weights, fp32). Adapters: random PEFT folders (A and B
random, so the update is real work, written here, no peft needed). The workload: throughput.py's `short` one at
`--num-requests`. Each configuration runs on a fresh engine with `max_loras` = the adapters in use, after a warm-up;
configurations alternate base / adapters `--repeats` times and the median is shown. The hardware limit of the extra
work: the update's FLOPs per token (2 x rank x (in + out) per projection) over the base model's.

    python benchmarks/lora_throughput.py [--adapters 1 4 16] [--rank 16] [--num-requests 64] [--repeats 2]
    python benchmarks/lora_throughput.py --device cuda [--shape 8b] [--repeats 1]

On CUDA the model is gpu_model.py's Llama-3-8B shape (random bf16 weights, `load_format="dummy"`), decode steps
replay CUDA graphs (with adapters too), and a second table times the batched LoRA kernel alone: one decoder
layer's four projections (fused QKV and gate/up, o, down) at a decode batch, the base GEMMs against the updates
of 1, 4 and 16 adapters, with the bytes the updates must read (their A and B, as the slots hold them).
"""
import argparse
import gc
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
from shapes import write_shape_dir   # noqa: E402
from throughput import ours_settings, workload   # noqa: E402

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


def engine_settings(device: str) -> dict:
    if device == "cpu":
        return ours_settings(None, load_format="dummy")
    return dict(device=device, dtype="bfloat16", load_format="dummy", max_num_seqs=256, max_model_len=4096,
                kv_cache_memory_gib=16)


def run(model: Path, adapters: dict[str, str], prompts, outputs, rank: int = 16, device: str = "cpu") -> float:
    settings = engine_settings(device) | ({"max_loras": len(adapters), "max_lora_rank": rank} if adapters else {})
    with LLM(str(model), **settings) as llm:
        for name, path in adapters.items():
            llm.load_lora(name, path)
        names = list(adapters) or [None]
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, lora_name=names[i % len(names)])
                  for i, n in enumerate(outputs)]
        llm.generate(prompts[:len(names)], params[:len(names)])   # warm-up: every adapter in its slot once
        started = time.perf_counter()
        llm.generate(prompts, params)
        tokens_per_s = sum(outputs) / (time.perf_counter() - started)
    del llm
    release(device)
    return tokens_per_s


def release(device: str) -> None:
    """Frees the memory of the engine just dropped, so that the next one gets it."""
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def extra_flops_share(config: ModelConfig, rank: int) -> float:
    base = update = 0
    for layer in range(config.num_layers):
        for d_in, d_out in module_shapes(config, layer).values():
            base += 2 * d_in * d_out
            update += 2 * rank * (d_in + d_out)
    return update / base


def kernel_cost(config: ModelConfig, rank: int, counts: list[int], tokens: int = 64, sweep: bool = False) -> None:
    """One decoder layer's base GEMMs against its LoRA updates (kernels.ops.lora_add, Triton) at `tokens` decode
    rows spread round-robin over 1, 4 and 16 adapters; median GPU time (CUDA graphs of each, do_bench)."""
    import triton.testing

    from kubeinfer.kernels import ops
    from kubeinfer.kernels.lora import lora_groups
    hidden, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    layers = [(hidden, q + 2 * kv, 3), (q, hidden, 1), (hidden, 2 * inter, 2), (inter, hidden, 1)]   # in, out, parts
    dev, dt = "cuda", torch.bfloat16
    xs = [torch.randn(tokens, d_in, device=dev, dtype=dt) for d_in, _, _ in layers]
    weights = [torch.randn(d_out, d_in, device=dev, dtype=dt) / d_in ** 0.5 for d_in, d_out, _ in layers]

    def median_us(fn) -> float:
        graph = torch.cuda.CUDAGraph()
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            fn()
        return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median") * 1e3

    base_us = median_us(lambda: [torch.nn.functional.linear(x, w) for x, w in zip(xs, weights)])
    base_bytes = sum(w.numel() * 2 for w in weights)
    print(f"\nbatched LoRA kernel, one decoder layer ({tokens} decode tokens, rank {rank}, bf16): base GEMMs "
          f"{base_us:.1f} us ({base_bytes / base_us / 1e3:.0f} GB/s)")
    print("| adapters | update us | share of the base GEMMs | update MB read | update GB/s |\n|---|---|---|---|---|")
    for count in counts:
        slots = [(torch.randn(count, rank * parts, d_in, device=dev, dtype=dt) / d_in ** 0.5,
                  torch.randn(count, d_out, rank * parts, device=dev, dtype=dt) * 0.01) for d_in, d_out, parts in layers]
        ids = torch.arange(tokens, device=dev) % count
        groups = lora_groups(ids, count)   # once per forward in the engine, shared by its 32 layers
        outs = [torch.zeros(tokens, d_out, device=dev, dtype=dt) for _, d_out, _ in layers]
        us = median_us(lambda: [ops.lora_add(o, x, a, b, ids, groups) for o, x, (a, b) in zip(outs, xs, slots)])
        moved = sum(a.numel() * 2 + b.numel() * 2 for a, b in slots)
        print(f"| {count} | {us:.1f} | {us / base_us:.1%} | {moved / 1e6:.1f} | {moved / us / 1e3:.0f} |", flush=True)
        if sweep:   # the kernel's two tile settings, this adapter count
            from kubeinfer.kernels import lora
            defaults = lora.SHRINK_K_CHUNK, lora.EXPAND_BLOCK_N
            for lora.SHRINK_K_CHUNK in (128, 256, 512):
                for lora.EXPAND_BLOCK_N in (64, 128, 256):
                    us = median_us(lambda: [ops.lora_add(o, x, a, b, ids, groups)
                                            for o, x, (a, b) in zip(outs, xs, slots)])
                    print(f"  shrink chunk {lora.SHRINK_K_CHUNK}, expand block {lora.EXPAND_BLOCK_N}: {us:.1f} us")
            lora.SHRINK_K_CHUNK, lora.EXPAND_BLOCK_N = defaults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", help="benchmarks/shapes.py's shape (default: 8b on CUDA, smollm2-135m on CPU)")
    parser.add_argument("--sweep", action="store_true", help="on CUDA: the kernel's tile settings too")
    parser.add_argument("--kernel-only", action="store_true", help="on CUDA: the kernel table alone")
    args = parser.parse_args()
    device = args.device
    print(f"# {describe()}, torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name()}" if device == "cuda" else ""))
    with tempfile.TemporaryDirectory() as tmp:
        model = write_shape_dir(Path(tmp) / "model", args.shape or ("8b" if device == "cuda" else "smollm2-135m"))
        config = ModelConfig.from_dir(str(model))
        if device == "cuda":
            kernel_cost(config, args.rank, args.adapters, sweep=args.sweep)
            if args.kernel_only:
                return
        prompts, outputs = workload(args.num_requests, config.vocab_size)
        folders = {f"a{i}": str(write_adapter(Path(tmp) / f"a{i}", config, args.rank, i))
                   for i in range(max(args.adapters))}
        with LLM(str(model), max_loras=1, max_lora_rank=args.rank, **engine_settings(device)) as llm:
            started = time.perf_counter()
            llm.load_lora("a0", folders["a0"])
            load_s = time.perf_counter() - started
            started = time.perf_counter()
            llm.generate([1, 2, 3], SamplingParams(max_tokens=1, lora_name="a0"))
            first_s = time.perf_counter() - started
        del llm
        release(device)
        print(f"adapter of rank {args.rank} on every projection: read and checked in {load_s * 1e3:.1f} ms; first "
              f"request on it (slot filled, one prefill) {first_s * 1e3:.1f} ms; update FLOPs "
              f"{extra_flops_share(config, args.rank):.1%} of the base model's per token")
        print(f"\n{args.num_requests} requests, {sum(outputs)} output tokens, median of {args.repeats}")
        print("| adapters in the batch | base tok/s | with adapters tok/s | share of base |\n|---|---|---|---|")
        for count in args.adapters:
            adapters = {name: folders[name] for name in list(folders)[:count]}
            base, lora = [], []
            for _ in range(args.repeats):
                base.append(run(model, {}, prompts, outputs, device=device))
                lora.append(run(model, adapters, prompts, outputs, args.rank, device))
            b, a = statistics.median(base), statistics.median(lora)
            print(f"| {count} | {b:.0f} | {a:.0f} | {a / b:.0%} |", flush=True)


if __name__ == "__main__":
    main()
