"""Decode's linear layers on one GPU: kernels/skinny_linear.py against torch's F.linear (cuBLAS), per projection
of the 8B shape, at the few rows of a decode step.

    python benchmarks/skinny_linear.py [--rows 1 2 4 8 16] [--sweep]

Each row of the table is one projection (Llama-3-8B: qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096, down
4096 x 14336; the LM head 128256 x 4096), bf16, random weights. Bytes counted: the weight, x and the output; GB/s
and the share of the measured copy bandwidth (benchmarks/kernels.py's 1 GiB device copy). `triton.testing.do_bench`
median, with its L2 flush between runs (o_proj's 33.5 MB would otherwise sit in the 50 MB L2). Both results are
checked against each other first. `--sweep`: every launch of SWEEP at each row count (shorter timings), the best
four and the worst per projection.
Without CUDA it says so and exits 0.
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from kernels import copy_bandwidth, time_ms   # noqa: E402  (benchmarks/kernels.py)

PROJECTIONS = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
               "down_proj": (4096, 14336), "lm_head": (128256, 4096)}
# (BLOCK_N, BLOCK_K, num_warps, num_stages, dot)
SWEEP = [(n, k, w, s, d) for d in (False, True) for n in (8, 16, 32, 64) for k in (128, 256, 512)
         for w, s in ((4, 3), (4, 5), (8, 4))]


def quick_ms(fn) -> float:
    """A sweep's timing: do_bench's median over fewer repeats than `time_ms` (the table's figures use that)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")


def of_copy(moved: int, us: float, copy_bw: float) -> float:
    """The rate `moved` bytes in `us` microseconds make, as a share of the copy bandwidth (bytes/s)."""
    return moved / (us * 1e-6) / copy_bw


def bytes_moved(rows: int, n: int, k: int) -> int:
    return 2 * (n * k + rows * k + rows * n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--projections", nargs="+", choices=PROJECTIONS, default=list(PROJECTIONS))
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    from kubeinfer.kernels.skinny_linear import default_config, skinny_linear

    copy_bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; copy bandwidth {copy_bw / 1e12:.2f} TB/s")
    print("| projection | rows | F.linear us | GB/s | of copy | skinny us | GB/s | of copy | speed-up | config |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in args.projections:
        n, k = PROJECTIONS[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * k ** -0.5
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            config = default_config(rows, n, k)
            torch.testing.assert_close(skinny_linear(x, w), F.linear(x, w), atol=2e-2, rtol=2e-2)
            moved = bytes_moved(rows, n, k)
            base = time_ms(lambda: F.linear(x, w)) * 1e3
            ours = time_ms(lambda: skinny_linear(x, w)) * 1e3
            print(f"| {name} | {rows} | {base:.1f} | {moved / base / 1e3:.0f} | {of_copy(moved, base, copy_bw):.0%} "
                  f"| {ours:.1f} | {moved / ours / 1e3:.0f} | {of_copy(moved, ours, copy_bw):.0%} "
                  f"| {base / ours:.2f}x | {config} |", flush=True)
            if not args.sweep:
                continue
            timed = []
            for launch in SWEEP:
                if rows > 1 and not launch[4]:
                    continue
                try:
                    timed.append((quick_ms(lambda: skinny_linear(x, w, config=launch)) * 1e3, launch))
                except Exception as e:   # noqa: BLE001  (a launch the compiler refuses: out of shared memory)
                    print(f"#   {name} rows {rows} {launch}: {type(e).__name__}: {str(e)[:80]}")
            timed.sort()
            best = ", ".join(f"{launch} {us:.1f} us ({of_copy(moved, us, copy_bw):.0%})"
                             for us, launch in timed[:4])
            print(f"#   sweep {name} rows {rows}: best {best}; worst {timed[-1][1]} {timed[-1][0]:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
