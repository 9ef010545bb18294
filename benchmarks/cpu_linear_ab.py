"""Two builds of the CPU linear kernel (`kernels/csrc/linear_cpu.c`) side by side: the tree's and a baseline's, on
the same panels and rows, alternating, with a check that both give bit-identical outputs.

    git worktree add /tmp/base HEAD~1
    python -P benchmarks/cpu_linear_ab.py --baseline /tmp/base/kernels/csrc [--rounds 7] \
        [--shapes 2048x2048x8192 ...]

Each build is compiled and cached as the library is (kernels/cpu_native.py, `library_from`). A shape is rows x K
-> N; each round times both builds, each the best of as many calls as fill ~0.2 s (3-200), and the figure is the
median over rounds of GFLOP/s (2 x rows x K x N over the time): on the noisy 2-vCPU box a single call spreads
10-40%, so only alternating medians separate the builds. The default shapes are the real models' gate/up projections
at prefill (2,048 rows) and decode (1-64 rows) sizes, and a down projection.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from kubeinfer.kernels import cpu_linear, cpu_native

sys.path.insert(0, str(Path(__file__).parent))
from peers.fma_peak import fma_peak   # noqa: E402
from peers.machine import describe   # noqa: E402

SHAPES = ["2048x2048x8192", "2048x8192x2048", "2048x576x3072", "64x2048x16384", "16x576x3072", "4x576x3072",
          "1x2048x16384"]


def build(sources: Path):
    """The kernel function of `sources/linear_cpu.c`, compiled and cached as the library is."""
    kernel = cpu_linear.panel_function(cpu_native.library_from("linear_cpu", sources))
    if kernel is None:
        raise SystemExit("the panel kernel does not run on this CPU (it needs AVX2 and FMA)")
    if kernel.width != cpu_linear.panel_width():
        raise SystemExit(f"{sources} lays out panels {kernel.width} wide, the tree {cpu_linear.panel_width()}")
    return kernel.function


def seconds(linear, x: torch.Tensor, panels: cpu_linear.Panels, out: torch.Tensor, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        started = time.perf_counter()
        linear(x.data_ptr(), x.stride(0), x.shape[0], panels.in_features, panels.data.data_ptr(),
                             panels.out_features, None, out.data_ptr(), panels.out_features, 0)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a csrc folder holding the other linear_cpu.c")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="ROWSxKxN")
    args = parser.parse_args()
    peak = fma_peak()
    print(f"machine: {describe()}; FMA units " + (f"{peak / 1e9:.0f} GFLOP/s fp32" if peak else "not measured"))
    builds = {"baseline": build(args.baseline), "tree": build(cpu_native.SOURCES)}
    print("| rows x K -> N | baseline GFLOP/s | tree GFLOP/s | tree / baseline | bit-identical |")
    print("|---|---|---|---|---|")
    for shape in args.shapes:
        rows, k, n = (int(part) for part in shape.split("x"))
        torch.manual_seed(0)
        x, panels = torch.randn(rows, k), cpu_linear.to_panels(torch.randn(n, k) / k ** 0.5)
        outs = {name: torch.empty(rows, n) for name in builds}
        flops = 2 * rows * k * n
        calls = max(3, min(200, int(0.2 / max(flops / 100e9, 1e-6))))
        rates = {name: [] for name in builds}
        for _ in range(args.rounds):
            for name, linear in builds.items():
                rates[name].append(flops / seconds(linear, x, panels, outs[name], calls) / 1e9)
        base, tree = statistics.median(rates["baseline"]), statistics.median(rates["tree"])
        same = torch.equal(outs["baseline"], outs["tree"])
        print(f"| {rows:,} x {k:,} -> {n:,} | {base:.1f} | {tree:.1f} | {tree / base:.2f}x | {same} |", flush=True)


if __name__ == "__main__":
    main()
