"""Where a batch-1 decode step's time goes, kernel by kernel: the profile behind the batch-1 MBU goal (issue #32).

    python benchmarks/decode_profile.py [--shape 8b] [--steps 32] [--top 12]

One request decodes `--steps` tokens through the engine (CUDA graphs on, as served) under torch.profiler. Per step:
- each kind of kernel (GEMMs, decode attention, RMSNorm, rotary, K/V store, SiLU-and-mul, the rest): launches,
  device time, share of the step, and for the GEMMs the bandwidth their weights were read at against the
  measured copy bandwidth: what the matrix reads lose, apart from what the small kernels add;
- the step's wall time and the device's idle share within it (the host's part: inputs, sampling, detokenizing).
The heaviest kernels are listed by name below. Then the host's side: the same number of steps again under
cProfile, plain (no torch profiler), with the wall time of as many unprofiled steps beside it: the Python functions
with the most own time a step (cProfile's own cost inflates them; read them as shares, not as microseconds).
Weights are random (`load_format="dummy"`). Without CUDA it profiles the CPU ops of the same steps (`--shape tiny`:
a smoke test of this script, not a figure).
"""
import argparse
import cProfile
import pstats
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from gpu_model import copy_bandwidth, matmul_params, random_prompts, sync   # noqa: E402
from shapes import SHAPES, write_shape_dir   # noqa: E402

# Kernel kinds by name, first match wins: Triton's kernels by their function names, the vendor GEMMs by theirs.
KINDS = [
    ("decode attention", r"_decode_(split|merge)_kernel|decode_attention"),
    ("RMSNorm (+ residual)", r"rms_norm"),
    ("rotary", r"rotary|_rotate_heads"),
    ("K/V store", r"store_kv"),
    ("SiLU and mul", r"silu_and_mul"),
    ("GEMM", r"gemm|gemv|cutlass|nvjet|xmma|sm90_|ampere_|linear|addmm|\bmm\b|matmul"),
]


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name, re.IGNORECASE)), "other")


def kernel_times(prof, device: str) -> dict[str, tuple[int, float]]:
    """name -> (launches, device microseconds) of every kernel (on the CPU: every op's own time)."""
    times: dict[str, tuple[int, float]] = {}
    for event in prof.key_averages():
        us = event.self_device_time_total if device == "cuda" else event.self_cpu_time_total
        if device == "cuda" and getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if us > 0:
            times[event.key] = (event.count, us)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="8b")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams

    device = "cuda" if torch.cuda.is_available() else "cpu"
    bandwidth = copy_bandwidth()
    with tempfile.TemporaryDirectory() as folder:
        model_dir = write_shape_dir(Path(folder) / args.shape, SHAPES[args.shape])
        llm = LLM(str(model_dir), load_format="dummy", device=device, max_num_seqs=1, kv_cache_memory_gib=1.0,
                  max_model_len=args.prompt_len + 6 * args.steps + 16)
    runner, engine = llm.engine.model_runner, llm.engine
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"# {name}; torch {torch.__version__}; shape {args.shape}, {runner.weight_bytes / 1e9:.2f} GB of weights; "
          f"measured copy bandwidth {bandwidth / 1e12:.2f} TB/s; CUDA graphs {'on' if runner.cuda_graphs else 'off'}")
    prompt = random_prompts(1, args.prompt_len, llm.engine.config.model_config.vocab_size)[0]
    params = SamplingParams(max_tokens=5 * args.steps, temperature=0, ignore_eos=True)   # 4 x steps run
    llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))   # warm-up
    engine.add_request("profiled", prompt, params)
    for _ in range(args.steps):   # the prefill and the first decode steps, outside the profile
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync()
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        sync()
        wall_us = (time.perf_counter() - started) / args.steps * 1e6
    host_rows = host_profile(engine, args.steps, args.top)
    while engine.has_unfinished_requests():
        engine.step()

    times = kernel_times(prof, device)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for kernel, (count, us) in times.items():
        by_kind[kind_of(kernel)][0] += count
        by_kind[kind_of(kernel)][1] += us
    busy_us = sum(us for _, us in by_kind.values()) / args.steps
    linear_bytes = matmul_params(runner) * runner.dtype.itemsize   # every matrix a token multiplies through, read once
    print(f"\n## One decode step (batch 1, ~{args.prompt_len + 2 * args.steps} tokens of context): wall "
          f"{wall_us:.0f} us, {'device' if device == 'cuda' else 'ops'} busy {busy_us:.0f} us "
          f"({busy_us / wall_us:.0%}), idle {wall_us - busy_us:.0f} us")
    print("| kind | launches a step | us a step | share of busy | note |\n|---|---|---|---|---|")
    for kind, (count, us) in sorted(by_kind.items(), key=lambda item: -item[1][1]):
        per_step = us / args.steps
        note = ""
        if kind == "GEMM" and device == "cuda" and per_step > 0:
            rate = linear_bytes / (per_step * 1e-6)
            note = (f"the matrices' {linear_bytes / 1e9:.2f} GB at {rate / 1e12:.2f} TB/s, "
                    f"{rate / bandwidth:.0%} of copy")
        print(f"| {kind} | {count / args.steps:.0f} | {per_step:.0f} | {per_step / busy_us:.1%} | {note} |")
    print(f"\n## The {args.top} heaviest kernels\n| kernel | kind | launches a step | us a step |\n|---|---|---|---|")
    for kernel, (count, us) in sorted(times.items(), key=lambda item: -item[1][1])[:args.top]:
        print(f"| {kernel[:90]} | {kind_of(kernel)} | {count / args.steps:.1f} | {us / args.steps:.1f} |")
    print(host_rows)
    llm.shutdown()
    return 0


def host_profile(engine, steps: int, top: int) -> str:
    """`steps` unprofiled steps timed, then `steps` under cProfile: the functions with the most own time a step."""
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    plain_us = (time.perf_counter() - started) / steps * 1e6
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    sync()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])   # (file, line, name) -> (cc, nc, tt, ct, callers)
    total = sum(tt for _, (_, _, tt, _, _) in rows)
    lines = [f"\n## The host: {steps} steps, {plain_us:.0f} us a step unprofiled, {total / steps * 1e6:.0f} us a step "
             f"of Python under cProfile",
             "| function | calls a step | own us a step (profiled) | share |\n|---|---|---|---|"]
    for (file, line, name), (_, calls, own, _, _) in rows[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        lines.append(f"| {name} ({where}) | {calls / steps:.0f} | {own / steps * 1e6:.0f} | {own / total:.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
