"""Where a CPU engine step's time goes on a real model's shape, at 1, 16 and 64 sequences, against the hardware.

    python -P benchmarks/cpu_step_profile.py [--shape smollm2-135m] [--batches 1 16 64] [--context 512]
                                              [--dtype float32] [--steps 12]

A fresh engine (dummy weights, `load_format="dummy"`) prefills `--batches` sequences of `--context` random tokens,
then decodes `--steps` tokens each; every layer's calls are timed by wrappers around the modules' forwards (CPU
ops are synchronous, so a wrapper's wall time is the op's): GEMMs (the linear layers), the LM head, decode attention
(with the K/V store), norms, rotary and SiLU, the sampler, and the host (the step's wall time less all those:
scheduling, inputs, Python between the ops, detokenizing). Beside each, what the hardware allows:
- GEMMs and the LM head against a large GEMM's FLOP/s (torch's, measured here; the FMA units' own rate, a C loop
  compiled here, is printed beside it and is the prefill's yardstick) and their weights'
  bytes against a streaming read's bandwidth (measured here): a decode step of few rows is bound by the read;
- decode attention's K/V bytes against the same streaming read.
Then one prefill step of `--prefill-tokens` tokens: its GEMMs' FLOP/s against the peak.
The wrappers cost ~1 us a call (about 10 a layer): read the host figure with that in mind.
"""
import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from peers.fma_peak import fma_peak   # noqa: E402
from peers.machine import describe   # noqa: E402
from shapes import CPU_SHAPES, SHAPES, write_shape_dir   # noqa: E402
from shapes import describe as describe_shape   # noqa: E402

from kubeinfer.runtime.layers.activation import SiluAndMul   # noqa: E402
from kubeinfer.runtime.layers.attention import PagedAttention   # noqa: E402
from kubeinfer.runtime.layers.embedding import ParallelLMHead   # noqa: E402
from kubeinfer.runtime.layers.linear import LinearBase   # noqa: E402
from kubeinfer.runtime.layers.norm import RMSNorm   # noqa: E402
from kubeinfer.runtime.layers.rotary import RotaryEmbedding   # noqa: E402
from kubeinfer.runtime.llm import LLM   # noqa: E402
from kubeinfer.runtime.sampling_params import SamplingParams   # noqa: E402

PARTS = {LinearBase: "GEMMs", ParallelLMHead: "LM head", PagedAttention: "attention", RMSNorm: "norm/rotary/SiLU",
         RotaryEmbedding: "norm/rotary/SiLU", SiluAndMul: "norm/rotary/SiLU"}


class Timers:
    """Seconds per part, accumulated by wrappers around the forwards of the classes in PARTS and the sampler."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner, method: str, part: str) -> None:
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += 1
        setattr(owner, method, timed)

    def install(self, runner) -> None:
        for module in runner.model.modules():
            part = next((name for cls, name in PARTS.items() if isinstance(module, cls)), None)
            if part is not None:
                self.wrap(module, "forward", part)
        self.wrap(runner, "sampler", "sampler")   # the runner calls its sampler object

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def streaming_read_bandwidth() -> float:
    """Bytes/s of a sum over 1 GiB (read once, from DRAM), median of 5."""
    data = torch.ones(2**28)
    data.sum()
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        data.sum()
        runs.append(time.perf_counter() - started)
    return data.numel() * 4 / statistics.median(runs)


def gemm_peak(dtype: torch.dtype) -> float:
    """FLOP/s of a large GEMM (2048 x 2048 x 2048), median of 5: the practical peak of this box's cores."""
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    a @ b
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        a @ b
        runs.append(time.perf_counter() - started)
    return 2 * 2048**3 / statistics.median(runs)


def model_sizes(llm: LLM) -> tuple[int, int, int]:
    """(matrix parameters of the layers, LM head parameters, K/V bytes per token of context)."""
    config = llm.engine.config.model_config
    runner = llm.engine.model_runner
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_layer = config.hidden_size * (q + 2 * kv) + q * config.hidden_size + 3 * config.hidden_size * config.intermediate_size
    kv_bytes = 2 * config.num_layers * kv * runner.kv_cache.element_size()
    return config.num_layers * per_layer, config.vocab_size * config.hidden_size, kv_bytes


def profile_decode(llm: LLM, timers: Timers, batch: int, context: int, steps: int) -> tuple[dict, float]:
    engine, rng = llm.engine, torch.Generator().manual_seed(batch)
    vocab = engine.config.model_config.vocab_size
    params = SamplingParams(max_tokens=4096 - context, temperature=0, ignore_eos=True)   # aborted after the steps
    for i in range(batch):
        engine.add_request(f"{batch}-{i}", torch.randint(1, vocab, (context,), generator=rng).tolist(), params)
    while engine.scheduler.waiting or any(seq.num_computed_tokens < context for seq in engine.scheduler.running):
        engine.step()   # the prefill, not timed
    engine.step()
    timers.reset()
    walls = []
    assert len(engine.scheduler.running) == batch and not engine.scheduler.waiting, \
        (len(engine.scheduler.running), len(engine.scheduler.waiting), llm.engine.model_runner.num_blocks)
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - started)
    for i in range(batch):
        engine.abort_request(f"{batch}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return {part: seconds / steps for part, seconds in timers.seconds.items()}, statistics.mean(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, default=512, help="prompt tokens of each sequence")
    parser.add_argument("--steps", type=int, default=12, help="decode steps timed at each batch size")
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    # The box's practical peak: the faster of an fp32 and a model-dtype GEMM (torch's bf16 GEMM on a CPU without bf16
    # instructions runs at a tenth of fp32's, which says nothing about what the cores can do).
    bandwidth, peak = streaming_read_bandwidth(), max(gemm_peak(torch.float32), gemm_peak(dtype))
    fma = fma_peak(torch.get_num_threads())   # what the FMA units do: the GEMM above is no peak
    print(f"machine: {describe()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"model: {describe_shape(args.shape)}, {args.dtype}")
    units = f"{fma / 1e9:.0f} GFLOP/s fp32" if fma else "not measured (no C compiler)"
    print(f"hardware: streaming read {bandwidth / 1e9:.1f} GB/s; GEMM 2048^3 {peak / 1e9:.0f} GFLOP/s (the faster of "
          f"float32 and {args.dtype}); FMA units {units}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape_dir(Path(tmp) / args.shape, args.shape)
        with LLM(str(model_dir), load_format="dummy", dtype=args.dtype, max_model_len=4096,
                 max_num_batched_tokens=args.prefill_tokens, kv_cache_memory_gib=4) as llm:
            timers = Timers()
            timers.install(llm.engine.model_runner)
            layer_params, head_params, kv_per_token = model_sizes(llm)
            item = dtype.itemsize
            print(f"\n## Decode, {args.context}-token contexts: ms per step (share of the step), and against the box\n")
            print("| sequences | step ms | GEMMs | LM head | attention | norm/rotary/SiLU | sampler | host | "
                  "GEMMs vs read / peak | LM head vs read | attention vs read |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for batch in args.batches:
                parts, wall = profile_decode(llm, timers, batch, args.context, args.steps)
                host = wall - sum(parts.values())
                cells = [f"{parts.get(p, 0) * 1e3:.1f} ({parts.get(p, 0) / wall:.0%})"
                         for p in ("GEMMs", "LM head", "attention", "norm/rotary/SiLU", "sampler")]
                gemm_s, head_s, attn_s = parts["GEMMs"], parts["LM head"], parts["attention"]
                gemm_read = layer_params * item / gemm_s / bandwidth
                gemm_flops = 2 * batch * layer_params / gemm_s / peak
                head_read = head_params * item / head_s / bandwidth
                attn_read = batch * (args.context + args.steps / 2) * kv_per_token / attn_s / bandwidth
                print(f"| {batch} | {wall * 1e3:.1f} | " + " | ".join(cells) + f" | {host * 1e3:.1f} ({host / wall:.0%}) | "
                      f"{gemm_read:.0%} / {gemm_flops:.0%} | {head_read:.0%} | {attn_read:.0%} |", flush=True)
            engine, vocab = llm.engine, llm.engine.config.model_config.vocab_size
            engine.add_request("prefill", torch.randint(1, vocab, (args.prefill_tokens,)).tolist(),
                               SamplingParams(max_tokens=1))
            timers.reset()
            started = time.perf_counter()
            engine.step()
            wall = time.perf_counter() - started
            gemm_s = timers.seconds["GEMMs"]
            rate = 2 * args.prefill_tokens * layer_params / gemm_s
            print(f"\n## Prefill, one step of {args.prefill_tokens} tokens: {wall * 1e3:.0f} ms; "
                  f"GEMMs {gemm_s * 1e3:.0f} ms at {rate / 1e9:.0f} GFLOP/s ({rate / peak:.0%} of the 2048^3 GEMM"
                  + (f", {rate / fma:.0%} of the FMA units" if fma else "") + "), attention "
                  f"{timers.seconds['attention'] * 1e3:.0f} ms, norm/rotary/SiLU "
                  f"{timers.seconds['norm/rotary/SiLU'] * 1e3:.0f} ms, the rest {(wall - sum(timers.seconds.values())) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
