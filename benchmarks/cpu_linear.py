"""bf16 linear on the CPU: F.linear (oneDNN packs the plain weight on every call) against a weight packed once
(kernels/cpu_linear.py), with fp32 F.linear (MKL) beside them, at the shapes of the throughput benchmark's model
(hidden 512: qkv 512 -> 1,024, o 512 -> 512, gate/up 512 -> 2 x 1,365, down 1,365 -> 512) and token counts from
a decode step to a prefill chunk. CPU time per call (process time, the best of 5 rounds), so that other load on the box
inflates the figures less than wall time would.

    python benchmarks/cpu_linear.py [--threads 1]
"""
import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kubeinfer.kernels import cpu_linear

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402

SHAPES = [(512, 1024), (512, 512), (512, 2730), (1365, 512)]   # (in, out)
TOKENS = [1, 16, 64, 256, 1024]


def per_call_us(fn, calls: int = 50) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_linear.can_pack(torch.empty(1, 1, dtype=torch.bfloat16)):
        raise SystemExit("this torch or CPU has no oneDNN bf16 GEMM: nothing to compare")
    print(f"machine: {describe()}, torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'tokens':>6} {'in':>5} {'out':>5} {'bf16 F.linear':>14} {'bf16 packed':>12} {'speed-up':>9} {'fp32':>9}"
          f"   (us of CPU time per call)")
    torch.manual_seed(0)
    for in_features, out_features in SHAPES:
        weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
        packed, weight32 = cpu_linear.pack(weight), weight.float()
        for tokens in TOKENS:
            x = torch.randn(tokens, in_features, dtype=torch.bfloat16)
            x32 = x.float()
            plain = per_call_us(lambda: F.linear(x, weight))
            ours = per_call_us(lambda: cpu_linear.linear(x, packed))
            fp32 = per_call_us(lambda: F.linear(x32, weight32))
            print(f"{tokens:>6} {in_features:>5} {out_features:>5} {plain:>14.1f} {ours:>12.1f} {plain / ours:>8.2f}x"
                  f" {fp32:>9.1f}")


if __name__ == "__main__":
    main()
