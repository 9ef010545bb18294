"""CPU linear layers at a real model's shapes: MKL on the plain weight (`F.linear`), oneDNN on a weight packed once,
and (AVX2 CPUs; 32-wide panels with AVX-512) the panel kernel (kernels/cpu_linear.py, csrc/linear_cpu.c), from a
decode step's rows to a prefill chunk's, against the box's streaming read and FLOP rate.

    python -P benchmarks/cpu_linear.py [--shape smollm2-135m] [--dtype float32] [--tokens 1 4 16 64 2048]

Each layout runs every projection of one layer (qkv, o, gate/up, down; and the LM head), over enough copies of the
weights that they are read from memory, not from the caches, as a model's 30 layers are. Wall time per call, the
best of rounds, the layouts alternating within each round. "GB/s": the weight's bytes over the time (a decode step
is bound by that read); "GFLOP/s": the products over the time (a prefill chunk is bound by that).
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
from cpu_step_profile import streaming_read_bandwidth   # noqa: E402
from shapes import CPU_SHAPES, SHAPES   # noqa: E402

COPIES_BYTES = 256 * 2 ** 20   # weights cycled per layout: well past the L3 cache


def projections(shape: dict) -> list[tuple[str, int, int]]:
    """(name, in, out) of one layer's projections and the LM head."""
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape.get("head_dim") or hidden // heads
    return [("qkv", hidden, (heads + 2 * kv_heads) * head_dim), ("o", heads * head_dim, hidden),
            ("gate/up", hidden, 2 * shape["intermediate_size"]), ("down", shape["intermediate_size"], hidden),
            ("LM head", hidden, shape["vocab_size"])]


def layouts(weight: torch.Tensor) -> dict:
    """name -> (a function of x) for every layout this CPU runs for `weight`."""
    runs = {"MKL F.linear": lambda x, w=weight: F.linear(x, w)}
    if cpu_linear.onednn_packs(weight):
        onednn = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        runs["oneDNN packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], "")
    if cpu_linear._panel_kernel() is not None:
        panels = cpu_linear.to_panels(weight)
        runs["panels"] = lambda x: cpu_linear.panel_linear(x, panels)
    return runs


def measure(copies: list[dict], x: torch.Tensor, rounds: int = 5) -> dict[str, float]:
    """Best seconds per call of each layout, cycling over the copies, layouts alternating within each round."""
    calls = max(3, min(60, 2 ** 14 // x.shape[0]))
    best = {name: float("inf") for name in copies[0]}
    for _ in range(rounds):
        for name in best:
            started = time.perf_counter()
            for i in range(calls):
                copies[i % len(copies)][name](x)
            best[name] = min(best[name], (time.perf_counter() - started) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 2048])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"machine: {describe()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"shape: {args.shape}, {args.dtype}; streaming read {streaming_read_bandwidth() / 1e9:.1f} GB/s")
    print("| projection | in -> out | tokens | layout | us per call | weight GB/s | GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    for name, in_features, out_features in projections(SHAPES[args.shape]):
        size = in_features * out_features * dtype.itemsize
        count = max(2, min(32, COPIES_BYTES // size))
        copies = [layouts(torch.randn(out_features, in_features, dtype=dtype) / in_features ** 0.5)
                  for _ in range(count)]
        for tokens in args.tokens:
            x = torch.randn(tokens, in_features, dtype=dtype)
            for layout, seconds in measure(copies, x).items():
                print(f"| {name} | {in_features} -> {out_features} | {tokens} | {layout} | {seconds * 1e6:,.1f} | "
                      f"{size / seconds / 1e9:.1f} | {2 * tokens * in_features * out_features / seconds / 1e9:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
