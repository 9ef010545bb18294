"""The weights phase of a start-up on CPU, with the page cache warm and cold, in fresh processes:

    python benchmarks/weights_load.py [--model-dir /tmp/kubeinfer-17/llama-1b] [--repeat 3]

Writes a Llama-3.2-1B-shaped random bf16 checkpoint (one 2.47 GB model.safetensors, as Hugging Face ships
that model) into `--model-dir` once (kept for the next run; ~40 s, 3.3 GB of memory at the peak), then starts
an engine on it `--repeat` times per cache state, each in a new process: "warm" reads the file from the page
cache, "cold" first drops this file's pages from it (posix_fadvise DONTNEED: only this file, no privilege
needed), so the weights come from the disk. Prints the runtime's own `weights` phase, the whole engine start, its
first request (16 prompt tokens, one output token) and the process's peak resident memory, each the median of the
runs. `--shape tiny` is a smoke test.

`node-warm` and `node-cold` start from the node's weight cache instead (`--weight-cache-dir`, written by one start
before the runs, whose time is printed: models/weight_cache.py), its file in the page cache or dropped from it;
`node-warm-copy` and `node-cold-copy` the same with KUBEINFER_WEIGHT_CACHE_READ=copy (the weights read into new memory
instead of used in place from the mapped file, the CPU's default).
The states alternate within each repeat, so drift in the box falls on each. `--model-dir` may be any model folder
(e.g. the trained SmolLM2's, ~/.cache/kubeinfer/models/smollm2-135m-instruct-v1).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def evict(model_dir: Path, pattern: str = "*.safetensors") -> None:
    """Drops the checkpoint's pages from the page cache (the kernel keeps dirty ones: sync first)."""
    for file in model_dir.glob(pattern):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def child(model_dir: str, weight_cache_dir: str | None) -> None:
    """One engine start; prints its phases and peak RSS as JSON on the last line."""
    import resource
    started = time.monotonic()
    from kubeinfer.runtime.llm import LLM
    llm = LLM(model_dir, device="cpu", kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=8,
              weight_cache_dir=weight_cache_dir)
    engine = time.monotonic() - started
    from kubeinfer.runtime.sampling_params import SamplingParams
    asked = time.monotonic()   # the first request reads every weight: a mapped one's pages come in now
    llm.generate([list(range(1, 17))], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    phases = {**llm.engine.startup_phases, "engine": engine, "first_request": time.monotonic() - asked,
              "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    print(json.dumps(phases))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/kubeinfer-17/llama-1b"))
    parser.add_argument("--shape", default="1b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", nargs="+", default=["warm", "cold"],
                        choices=["warm", "cold", "node-warm", "node-cold", "node-warm-copy", "node-cold-copy"])
    parser.add_argument("--weight-cache-dir", type=Path, default=Path("/tmp/kubeinfer-weight-cache"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.child_cache)
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    if not (args.model_dir / "model.safetensors").is_file():
        from shapes import SHAPES
        from gpu_startup import write_checkpoint
        seconds = write_checkpoint(args.model_dir, SHAPES[args.shape])
        print(f"checkpoint written in {seconds:.1f} s")
    size = sum(f.stat().st_size for f in args.model_dir.glob("*.safetensors"))
    print(f"checkpoint: {args.model_dir}, {size / 1e9:.2f} GB of safetensors")
    def start(cache_dir: Path | None, copy: bool = False) -> dict | None:
        command = [sys.executable, "-P", __file__, "--child", str(args.model_dir)]
        command += ["--child-cache", str(cache_dir)] if cache_dir else []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"KUBEINFER_WEIGHT_CACHE_READ": "copy"} if copy else {})}
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        if result.returncode != 0:
            print(result.stdout, result.stderr, sep="\n")
            return None
        return json.loads(result.stdout.strip().splitlines()[-1])

    if any(state.startswith("node") for state in args.cache):
        for old in args.weight_cache_dir.glob("*.weights"):
            old.unlink()
        first = start(args.weight_cache_dir)
        print(f"first start, writing the node's cache: weights phase {first['weights']:.2f} s, engine "
              f"{first['engine']:.2f} s", flush=True)
    runs = {state: [] for state in args.cache}
    for _ in range(args.repeat):
        for state in args.cache:
            node = state.startswith("node")
            if "cold" in state:
                evict(args.weight_cache_dir if node else args.model_dir, "*.weights" if node else "*.safetensors")
            run = start(args.weight_cache_dir if node else None, copy=state.endswith("copy"))
            if run is None:
                return 1
            runs[state].append(run)
            print(f"  {state}: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items()), flush=True)
    rows = {state: {key: statistics.median(run[key] for run in got) for key in got[0]} for state, got in runs.items()}
    keys = list(next(iter(rows.values())))
    print(f"\n## median of {args.repeat} (s; peak RSS in GiB)\n")
    print("| page cache | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for state, row in rows.items():
        print(f"| {state} | " + " | ".join(f"{row[key]:.2f}" for key in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
