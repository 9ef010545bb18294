"""The fused MoE kernel on one GPU: decode bandwidth over the activated experts, prefill TFLOP/s, beside the
per-expert PyTorch reference and a dense bf16 GEMM of the same work.

    python benchmarks/moe_kernel.py [--experts 128] [--top-k 8] [--hidden 2048] [--intermediate 768]

The default layer is Qwen3-30B-A3B's (128 experts of 768, top-8, hidden 2048), bf16, random weights and routing
(uniform top-k of random logits, renormalised), fixed seed.
- Decode (batches 1, 16, 64): bytes counted = the weights of the distinct experts the batch activates (gate, up
  and down, read once) plus x and the output. Timed as one CUDA graph replay (as the runtime runs decode), and
  as plain launches, so the host's part shows. MBU = bytes / time / the measured copy bandwidth.
- Prefill (4096 tokens): FLOPs counted = 2 x tokens x top_k x 3 x hidden x intermediate; beside it, one dense
  GEMM chain of the same FLOPs (tokens*top_k rows through one expert's weights) as the matrix-rate ceiling.
- `--sweep`: the decode rows again for each launch of DECODE_SWEEP (both GEMMs' BLOCK_N, BLOCK_K, warps,
  stages), and where one graph replay's time goes at each batch: the routing's alignment alone, and the rest.
Timings: `triton.testing.do_bench`, median. Without CUDA it says so and exits 0.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernels import copy_bandwidth, time_ms   # noqa: E402  (benchmarks/kernels.py)


# (BLOCK_N, BLOCK_K, num_warps, num_stages) of both grouped GEMMs; None is the launcher's default (64, 64, 4, 3).
DECODE_SWEEP = [(32, 128, 4, 3), (16, 256, 2, 4), (128, 64, 8, 3), (32, 64, 2, 4), (32, 256, 4, 3), (64, 128, 4, 4),
                (16, 128, 2, 3), (64, 256, 8, 3)]


def random_layer(num_experts: int, hidden: int, intermediate: int, dtype: torch.dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(num_experts, 2 * intermediate, hidden, generator=gen, device="cuda", dtype=dtype) * hidden ** -0.5
    w2 = torch.randn(num_experts, hidden, intermediate, generator=gen, device="cuda", dtype=dtype) * intermediate ** -0.5
    return w13, w2


def random_routing(num_tokens: int, num_experts: int, top_k: int, hidden: int, dtype: torch.dtype):
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)
    x = torch.randn(num_tokens, hidden, generator=gen, device="cuda", dtype=dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen, device="cuda")
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return x, (weights / weights.sum(-1, keepdim=True)).to(dtype), ids


def graph_of(fn):
    """`fn` captured in a CUDA graph (after a warm-up on a side stream); returns the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--prefill-tokens", type=int, default=4096)
    parser.add_argument("--sweep", action="store_true", help="decode launches swept, and the routing's share")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/moe_kernel.py needs a CUDA GPU (none found): no figures on this machine.")
        return 0
    from kubeinfer.kernels import references
    from kubeinfer.kernels.fused_moe import fused_moe

    dtype, elem = torch.bfloat16, 2
    E, k, H, I = args.experts, args.top_k, args.hidden, args.intermediate
    print(f"# Fused MoE on {torch.cuda.get_device_name()}; {E} experts of {I}, top-{k}, hidden {H}, {dtype}")
    copy_bw = copy_bandwidth()
    print(f"measured copy bandwidth: {copy_bw / 1e9:.0f} GB/s")
    w13, w2 = random_layer(E, H, I, dtype)
    x, weights, ids = random_routing(64, E, k, H, dtype)
    error = (fused_moe(x, w13, w2, weights, ids).float() - references.fused_moe(x, w13, w2, weights, ids).float())
    print(f"max |triton - reference| at 64 tokens: {float(error.abs().max()):.2e}")

    expert_bytes = 3 * H * I * elem
    print("\n## Decode: bytes = distinct activated experts' weights + x + out")
    print("| tokens | experts hit | MB read | graph replay (us) | GB/s | MBU (vs copy) | plain launches (us) "
          "| reference (us) |\n|---|---|---|---|---|---|---|---|")
    for tokens in (1, 16, 64):
        x, weights, ids = random_routing(tokens, E, k, H, dtype)
        hit = int(torch.unique(ids).numel())
        moved = hit * expert_bytes + 2 * tokens * H * elem
        replay = graph_of(lambda: fused_moe(x, w13, w2, weights, ids))
        graph_ms = time_ms(replay)
        plain_ms = time_ms(lambda: fused_moe(x, w13, w2, weights, ids))
        ref_ms = time_ms(lambda: references.fused_moe(x, w13, w2, weights, ids))
        gbps = moved / (graph_ms * 1e-3)
        print(f"| {tokens} | {hit} | {moved / 1e6:.1f} | {graph_ms * 1e3:.1f} | {gbps / 1e9:.0f} | "
              f"{gbps / copy_bw:.0%} | {plain_ms * 1e3:.1f} | {ref_ms * 1e3:.1f} |")

    if args.sweep:
        from kubeinfer.kernels import fused_moe as module
        print("\n## Decode launches (graph replay, us): BLOCK_N, BLOCK_K, warps, stages of both GEMMs; the alignment "
              "alone, by the one-program kernel and by torch's sort")
        print("| tokens | alignment: kernel | alignment: sort | " + " | ".join(str(c) for c in [None, *DECODE_SWEEP])
              + " |")
        print("|---" * (len(DECODE_SWEEP) + 4) + "|")
        limit = module.ALIGN_KERNEL_MAX_PAIRS
        for tokens in (1, 16, 64, 512):
            x, weights, ids = random_routing(tokens, E, k, H, dtype)
            align_us = time_ms(graph_of(lambda: module.align_by_expert(ids, E, 16))) * 1e3
            module.ALIGN_KERNEL_MAX_PAIRS = -1
            sort_us = time_ms(graph_of(lambda: module.align_by_expert(ids, E, 16))) * 1e3
            module.ALIGN_KERNEL_MAX_PAIRS = limit
            cells = []
            for config in [None, *DECODE_SWEEP]:
                try:
                    replay = graph_of(lambda: fused_moe(x, w13, w2, weights, ids, config=config))
                    cells.append(f"{time_ms(replay) * 1e3:.1f}")
                except Exception as error:   # e.g. out of shared memory: the sweep goes on
                    cells.append(f"failed: {type(error).__name__}")
            print(f"| {tokens} | {align_us:.1f} | {sort_us:.1f} | " + " | ".join(cells) + " |")

    T = args.prefill_tokens
    x, weights, ids = random_routing(T, E, k, H, dtype)
    flops = 2 * T * k * 3 * H * I
    dense_x = torch.randn(T * k, H, device="cuda", dtype=dtype)

    def dense_chain():
        gate_up = dense_x @ w13[0].t()
        return (torch.nn.functional.silu(gate_up[:, :I]) * gate_up[:, I:]) @ w2[0].t()

    print(f"\n## Prefill: {T} tokens, {flops / 1e12:.3f} TFLOP counted")
    print("| impl | time (ms) | TFLOP/s |\n|---|---|---|")
    for name, fn in (("triton fused MoE", lambda: fused_moe(x, w13, w2, weights, ids)),
                     ("per-expert reference (torch)", lambda: references.fused_moe(x, w13, w2, weights, ids)),
                     ("dense chain, same FLOPs (ceiling)", dense_chain)):
        ms = time_ms(fn)
        print(f"| {name} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
