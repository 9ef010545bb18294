"""Start-up phases of the runtime on a GPU, Triton's kernel cache cold and then warm, in one run:

    python benchmarks/gpu_startup.py [--shape 1b]

Writes a random-weight bf16 checkpoint of the shape (safetensors, as Hugging Face lays it out) once, then
starts an engine on it in a fresh process twice, with the same new TRITON_CACHE_DIR: the first start
compiles every kernel, the second loads them from the cache. Each start reports its phases (imports, weights
read into the model, KV cache sizing and allocation, warm-up forwards, CUDA graph capture). The checkpoint
was just written, so it is read from the page cache: the weights phase is the loader's own cost, not a disk's.
`--shape tiny` runs on CPU (a smoke test of this script).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_checkpoint(path: Path, shape: dict) -> float:
    """A Hugging Face folder with random bf16/fp32 weights; returns the seconds it took."""
    import torch
    from safetensors.torch import save_file

    from kubeinfer.runtime.demo import random_llama_weights
    sys.path.insert(0, str(Path(__file__).parent))
    from shapes import write_shape_dir

    started = time.perf_counter()
    write_shape_dir(path, shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = random_llama_weights(shape, device=device, dtype=getattr(torch, shape["dtype"]))
    if shape["tie_word_embeddings"]:
        del weights["lm_head.weight"]
    save_file(weights, str(path / "model.safetensors"))
    return time.perf_counter() - started


def child(model_dir: str, max_num_seqs: int) -> None:
    """One start: prints its phases as JSON on the last line (nothing but the standard library is imported
    before the clock starts)."""
    started = time.monotonic()
    from kubeinfer.runtime.llm import LLM
    imports = time.monotonic() - started
    llm = LLM(model_dir, max_num_seqs=max_num_seqs, kv_cache_memory_gib=4.0, max_model_len=1024)
    phases = {"imports": imports, **llm.engine.startup_phases, "total": time.monotonic() - started}
    print(json.dumps(phases))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1b")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.max_num_seqs)
        return 0
    import torch
    if not torch.cuda.is_available() and args.shape != "tiny":
        print("benchmarks/gpu_startup.py needs a CUDA GPU for this shape (none found); --shape tiny runs on CPU.")
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    from shapes import SHAPES

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / f"llama-{args.shape}"
        seconds = write_checkpoint(model_dir, SHAPES[args.shape])
        size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
        print(f"checkpoint: {args.shape} shape, {size / 1e9:.2f} GB of safetensors written in {seconds:.1f} s")
        env = {**os.environ, "TRITON_CACHE_DIR": str(Path(tmp) / "triton-cache"), "PYTHONUNBUFFERED": "1"}
        runs = {}
        for label in ("cold Triton cache", "warm Triton cache"):
            result = subprocess.run([sys.executable, "-P", __file__, "--child", str(model_dir),
                                     "--max-num-seqs", str(args.max_num_seqs)], env=env, capture_output=True,
                                    text=True, timeout=600)
            if result.returncode != 0:
                print(result.stdout, result.stderr, sep="\n")
                return result.returncode
            runs[label] = json.loads(result.stdout.strip().splitlines()[-1])
    phases = list(next(iter(runs.values())))
    print(f"\n## Start-up phases (s), {args.shape} shape, max_num_seqs {args.max_num_seqs}\n")
    print("| phase | " + " | ".join(runs) + " |\n|---|" + "---|" * len(runs))
    for phase in phases:
        print(f"| {phase} | " + " | ".join(f"{run.get(phase, float('nan')):.2f}" for run in runs.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
