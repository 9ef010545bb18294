"""Tensor parallelism on this machine: engine step time at TP=1/2/4, the all-reduce share, memory per rank.

Fixed workload (seed 0): a random-weight Llama (hidden 1024, 8 layers, 16 query / 4 KV heads, vocab 16384,
~0.5 GB fp32); 4 prompts of 256 tokens prefilled in one step, then 48 decode steps at batch 4, greedy.
Each TP size runs in fresh processes (best of --repeat), twice: as is, and with `torch.distributed.all_reduce`
replaced by a no-op in every rank (wrong numbers, same compute), so `1 - t_skip / t` is the all-reduce share.
Rank 0 also times its own collectives (all-reduce + LM-head all-gather; this includes waiting for the
slowest rank) and the shared-memory send of each step's inputs. Memory: each rank's parameter bytes and
its peak RSS growth over a process that has only imported the runtime (CPU), or max_memory_allocated (GPU).

    python benchmarks/tensor_parallel.py [--tp 1 2 4] [--device cpu]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

SKIP_ALL_REDUCE = "KUBEINFER_BENCH_SKIP_ALL_REDUCE"
# Module level on purpose: TP workers are started with "spawn", which imports this file in each of them.
if os.environ.get(SKIP_ALL_REDUCE) == "1":
    dist.all_reduce = lambda tensor, *args, **kwargs: None

NUM_PROMPTS, PROMPT_LEN, DECODE_STEPS = 4, 256, 48


def build_model(path: Path) -> Path:
    from kubeinfer.runtime.demo import train_tokenizer, write_llama_model
    write_llama_model(path, train_tokenizer(vocab_size=1024), vocab_size=16384, hidden_size=1024,
                      intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      head_dim=64, max_position_embeddings=4096)
    return path


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class _Timed:
    """Wraps a torch.distributed function in this process, summing the seconds spent in it."""

    def __init__(self, name: str):
        self.name, self.original, self.seconds = name, getattr(dist, name), 0.0
        setattr(dist, name, self)

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.original(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


def child(model: str, tp: int, device: str, threads: int | None) -> dict:
    """One run at one TP size; returns its figures."""
    from kubeinfer.runtime.engine.tp_worker import WorkerGroup
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams

    if threads:
        torch.set_num_threads(threads)
    baseline_kib = _proc_kib(os.getpid(), "VmRSS")
    baseline_anon_kib = _proc_kib(os.getpid(), "RssAnon")
    collectives = [_Timed("all_reduce"), _Timed("all_gather")]
    send_seconds: list[float] = []
    original_send = WorkerGroup.send

    def timed_send(self, step):
        started = time.perf_counter()
        original_send(self, step)
        send_seconds.append(time.perf_counter() - started)
    WorkerGroup.send = timed_send

    llm = LLM(model, tensor_parallel_size=tp, device=device, max_num_batched_tokens=NUM_PROMPTS * PROMPT_LEN,
              num_kvcache_blocks=128)
    runner = llm.engine.model_runner
    pids = [os.getpid()] + (runner.workers.pids if runner.workers else [])
    if runner.device.type == "cuda":
        memory = {"weight_bytes_rank0": runner.weight_bytes,
                  "peak_allocated_bytes_rank0": torch.cuda.max_memory_allocated(runner.device)}
    else:
        memory = {"weight_bytes_rank0": runner.weight_bytes,
                  "peak_rss_growth_bytes": [(_proc_kib(pid, "VmHWM") - baseline_kib) * 1024 for pid in pids],
                  "anon_rss_growth_bytes": [(_proc_kib(pid, "RssAnon") - baseline_anon_kib) * 1024 for pid in pids]}
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 16384, (PROMPT_LEN,), generator=generator).tolist() for _ in range(NUM_PROMPTS)]
    params = SamplingParams(max_tokens=DECODE_STEPS + 1, temperature=0, ignore_eos=True)
    llm.generate([p[:16] for p in prompts], SamplingParams(max_tokens=4, ignore_eos=True))   # warm-up
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{i}", prompt, params)
    steps, collective_seconds = [], []
    del send_seconds[:]
    while engine.has_unfinished_requests():
        before = sum(c.seconds for c in collectives)
        started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - started)
        collective_seconds.append(sum(c.seconds for c in collectives) - before)
    threads_per_rank = torch.get_num_threads()
    llm.shutdown()
    assert len(steps) == DECODE_STEPS + 1, len(steps)
    return {"tp": tp, "prefill_s": steps[0], "decode_s": statistics.median(steps[1:]),
            "collectives_prefill_s": collective_seconds[0],
            "collectives_decode_s": statistics.median(collective_seconds[1:]),
            "send_us": statistics.median(send_seconds) * 1e6 if send_seconds else 0.0,
            "threads_per_rank": threads_per_rank,
            **memory}


def best_of(repeat: int, *args, **kwargs) -> dict:
    """The run with the fastest decode step of `repeat` runs (other processes on the machine add noise)."""
    return min((run_child(*args, **kwargs) for _ in range(repeat)), key=lambda run: run["decode_s"])


def run_child(model: Path, tp: int, device: str, skip_all_reduce: bool, threads: int | None = None) -> dict:
    env = {**os.environ, SKIP_ALL_REDUCE: "1" if skip_all_reduce else "0"}
    command = [sys.executable, __file__, "--child", str(model), "--tp", str(tp), "--device", device]
    result = subprocess.run(command + (["--threads", str(threads)] if threads else []),
                            env=env, capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"TP={tp} run failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting; the fastest is reported")
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tp[0], args.device, args.threads)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model")
        model_bytes = sum(t.numel() * t.element_size() for t in _checkpoint_tensors(model))
        cpus = len(os.sched_getaffinity(0))
        print(f"torch {torch.__version__}, {cpus} CPUs (load average {os.getloadavg()[0]:.1f}), "
              f"device {args.device}; model {model_bytes / 2**20:.0f} MiB "
              f"fp32; workload: prefill {NUM_PROMPTS}x{PROMPT_LEN} tokens in one step, then {DECODE_STEPS} decode "
              f"steps at batch {NUM_PROMPTS}")
        print(f"{'TP':>3}{'thr/rank':>9}{'prefill ms':>11}{'decode ms':>10}{'no-AR ms':>9}{'AR share':>9}"
              f"{'rank0 coll.':>12}{'send us':>8}{'weights/rank MiB':>17}{'peak RSS growth MiB':>21}"
              f"{'anon RSS growth MiB':>21}")
        # TP=1 also on one thread: TP=N gives each rank cpus/N threads, so this separates threading from TP.
        runs = [(tp, None) for tp in args.tp] + ([(1, 1)] if 1 in args.tp and cpus > 1 and args.device == "cpu" else [])
        for tp, threads in runs:
            full = best_of(args.repeat, model, tp, args.device, skip_all_reduce=False, threads=threads)
            skip = best_of(args.repeat, model, tp, args.device, skip_all_reduce=True) if tp > 1 else full
            share = 1 - skip["decode_s"] / full["decode_s"] if tp > 1 else 0.0
            coll = full["collectives_decode_s"] / full["decode_s"]
            growth = " ".join(f"{b / 2**20:.0f}" for b in full.get("peak_rss_growth_bytes", []))
            anon = " ".join(f"{b / 2**20:.0f}" for b in full.get("anon_rss_growth_bytes", []))
            if "peak_allocated_bytes_rank0" in full:
                growth, anon = f"{full['peak_allocated_bytes_rank0'] / 2**20:.0f} (rank 0, GPU)", ""
            print(f"{tp:>3}{full['threads_per_rank']:>9}{full['prefill_s'] * 1e3:>11.1f}{full['decode_s'] * 1e3:>10.1f}"
                  f"{skip['decode_s'] * 1e3:>9.1f}{share:>9.0%}{coll:>12.0%}{full['send_us']:>8.0f}"
                  f"{full['weight_bytes_rank0'] / 2**20:>17.0f}{growth:>21}{anon:>21}")
            sys.stdout.flush()


def _checkpoint_tensors(model: Path):
    from safetensors import safe_open
    with safe_open(model / "model.safetensors", framework="pt") as checkpoint:
        for name in checkpoint.keys():
            yield checkpoint.get_tensor(name)


if __name__ == "__main__":
    main()
