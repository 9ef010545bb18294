"""A Llama-3-8B-shaped model on one GPU, against the HBM roofline, in one run:

    python benchmarks/gpu_model.py [--shape 8b] [--decode-tokens 256] [--batches 64 256]

1. Copy bandwidth of the device, measured (a large device-to-device copy, bytes read + written).
2. Batch-1 decode through the engine, eager and with CUDA graphs: tokens/s, time per step, and the model
   bandwidth utilisation: bytes a decode token must read (every weight but the embedding table, which is
   gathered one row at a time, plus the K/V of its context) x tokens/s / measured copy bandwidth. The GPU
   time of one graph replay (forward only) and of the LM head are shown beside, so the host's share is visible.
3. Prefill of one long prompt: tokens/s and model TFLOP/s (2 x matmul parameters x tokens + attention).
4. Offline throughput (`LLM.generate`) at each batch size: prompts of `--prompt-len` random tokens,
   `--output-len` tokens each (ignore_eos), output tokens/s over the whole run, prefill included.
5. transformers' `generate` on the same shape (its own random weights, bf16, eager), batch 1, beside ours.

Weights are random (`load_format="dummy"`: no checkpoint is written or read). Fixed seeds. `--shape tiny`
runs every step on CPU in seconds (a smoke test of this script, not a figure).
"""
import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import SHAPES, write_shape_dir   # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_ms(fn) -> float:
    """Median milliseconds of `fn` (events on CUDA, after warm-up)."""
    if torch.cuda.is_available():
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    started = time.perf_counter()
    for _ in range(5):
        fn()
    return (time.perf_counter() - started) / 5 * 1e3


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy, counting bytes read and written."""
    if not torch.cuda.is_available():
        return float("nan")
    src = torch.randn(2**28, device="cuda")   # 1 GiB of fp32
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def random_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def decode_rate(llm, prompts: list[list[int]], num_tokens: int) -> tuple[float, float]:
    """(output tokens/s, seconds per step) of the decode steps alone: timing starts once every request has
    its first token."""
    from kubeinfer.runtime.sampling_params import SamplingParams
    engine = llm.engine
    params = SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"decode-{i}", prompt, params)
    started_ids: set[str] = set()
    while len(started_ids) < len(prompts):
        started_ids.update(o.request_id for o in engine.step())
    sync()
    started, steps, tokens = time.perf_counter(), 0, 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
        steps += 1
    elapsed = time.perf_counter() - started
    return tokens / elapsed, elapsed / steps


def decode_bytes_per_token(runner, model_config, context: int) -> int:
    """Bytes one batch-1 decode step must read: every weight except the embedding table (one row gathered;
    when tied to the LM head it is read whole by the head), plus the K/V of `context` tokens."""
    embedding = runner.model.model.embed_tokens.weight
    untied = embedding is not runner.model.lm_head.weight
    weights = runner.weight_bytes - (embedding.numel() * embedding.element_size() if untied else 0)
    return weights + context * model_config.kv_bytes_per_token


def matmul_params(runner) -> int:
    """Parameters of the matrices a token multiplies through (all linears and the LM head)."""
    return sum(p.numel() for name, p in runner.model.named_parameters()
               if p.dim() == 2 and "embed_tokens" not in name) + (
        runner.model.lm_head.weight.numel() if runner.model.lm_head.weight is runner.model.model.embed_tokens.weight
        else 0)


def bench_ours(model_dir: Path, args, bandwidth: float, device: str) -> None:
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams

    max_batch = max(args.batches)
    started = time.perf_counter()
    llm = LLM(str(model_dir), load_format="dummy", device=device, max_num_seqs=max_batch,
              kv_cache_memory_gib=args.kv_cache_gib, max_model_len=args.max_model_len)
    runner, config = llm.engine.model_runner, llm.engine.config
    model_config = config.model_config
    print(f"\nengine built in {time.perf_counter() - started:.1f} s; start-up phases: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in llm.engine.startup_phases.items()))
    print(f"weights {runner.weight_bytes / 1e9:.2f} GB ({model_config.dtype}), KV cache {runner.num_blocks} blocks "
          f"of {config.block_size} tokens, CUDA graphs: "
          f"{'none' if runner.cuda_graphs is None else f'{len(runner.cuda_graphs.batch_sizes)} sizes up to {runner.cuda_graphs.max_batch_size}'}")
    vocab = model_config.vocab_size

    # -- batch-1 decode, eager vs graphs --------------------------------------------------------------------
    context = args.prompt_len + args.decode_tokens // 2
    bytes_per_token = decode_bytes_per_token(runner, model_config, context)
    print(f"\n## Batch-1 decode: prompt {args.prompt_len}, {args.decode_tokens} tokens; bytes per token "
          f"{bytes_per_token / 1e9:.3f} GB (weights but the embedding + K/V of ~{context} tokens); floor at the "
          f"measured copy bandwidth: {bytes_per_token / bandwidth * 1e3:.2f} ms/token")
    print("| mode | tokens/s | ms/step | MBU (vs measured copy BW) | vs 3.35 TB/s spec |\n|---|---|---|---|---|")
    graphs = runner.cuda_graphs
    prompt = random_prompts(1, args.prompt_len, vocab, seed=1)
    for mode in ("eager", "CUDA graphs"):
        runner.cuda_graphs = None if mode == "eager" else graphs
        if mode == "CUDA graphs" and graphs is None:
            continue
        rate, step_s = decode_rate(llm, prompt, args.decode_tokens)
        print(f"| {mode} | {rate:.1f} | {step_s * 1e3:.2f} | {bytes_per_token * rate / bandwidth:.1%} | "
              f"{bytes_per_token * rate / 3.35e12:.1%} |")
    runner.cuda_graphs = graphs
    if graphs is not None:
        replay_ms = bench_ms(lambda: graphs.graphs[1].replay())
        row = torch.randn(1, model_config.hidden_size, device=device, dtype=runner.dtype)
        head_ms = bench_ms(lambda: runner.model.compute_logits(row))
        print(f"GPU time per token: forward graph replay {replay_ms:.3f} ms + LM head {head_ms:.3f} ms = "
              f"{replay_ms + head_ms:.3f} ms (the rest of a step is the host: inputs, sampling, detokenizing)")

    # -- prefill of one long prompt -------------------------------------------------------------------------
    length = min(args.prefill_len, runner.max_model_len - 1, config.max_num_batched_tokens)
    prompts = random_prompts(3, length, vocab, seed=2)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate([prompts[0]], params)   # warm-up of this shape
    sync()
    started = time.perf_counter()
    llm.generate(prompts[1:], params)
    seconds = (time.perf_counter() - started) / 2
    attention = 4 * model_config.num_layers * model_config.num_heads * model_config.head_dim * length * (length + 1) / 2
    flops = 2 * matmul_params(runner) * length + attention
    print(f"\n## Prefill: one prompt of {length} tokens (one step, max_num_batched_tokens "
          f"{config.max_num_batched_tokens}): {seconds * 1e3:.1f} ms, {length / seconds:.0f} tokens/s, "
          f"{flops / seconds / 1e12:.0f} TFLOP/s (2 x {matmul_params(runner) / 1e9:.2f}B matmul params x tokens "
          f"+ causal attention)")

    # -- offline throughput ---------------------------------------------------------------------------------
    print(f"\n## Offline throughput: prompts of {args.prompt_len} random tokens, {args.output_len} output tokens "
          f"each, greedy, ignore_eos (LLM.generate, prefill included)")
    print("| batch | output tokens/s | total tokens/s | seconds |\n|---|---|---|---|")
    for batch in args.batches:
        prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch)
        sync()
        started = time.perf_counter()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True))
        seconds = time.perf_counter() - started
        out_tokens = sum(len(o.token_ids) for o in outputs)
        print(f"| {batch} | {out_tokens / seconds:.0f} | {(out_tokens + batch * args.prompt_len) / seconds:.0f} | "
              f"{seconds:.1f} |")
    llm.shutdown()
    del llm, runner, graphs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_transformers(model_dir: Path, args, device: str) -> None:
    import transformers as tf
    config = tf.AutoConfig.from_pretrained(model_dir)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    started = time.perf_counter()
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    built = time.perf_counter() - started
    prompt = torch.tensor(random_prompts(1, args.prompt_len, config.vocab_size, seed=1), device=device)
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **kwargs)   # warm-up
    sync()
    started = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens, **kwargs)
    sync()
    seconds = time.perf_counter() - started
    tokens = out.shape[1] - prompt.shape[1]
    print(f"\n## transformers {tf.__version__} generate, batch 1, eager, {dtype} (model built in {built:.1f} s): "
          f"{tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s (prefill of {args.prompt_len} "
          f"included)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="8b")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=2048)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--kv-cache-gib", type=float, default=16.0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and args.shape != "tiny":
        print("benchmarks/gpu_model.py needs a CUDA GPU for this shape (none found); --shape tiny runs on CPU.")
        return 0
    torch.manual_seed(0)
    if device == "cuda":
        import triton
        props = torch.cuda.get_device_properties(0)
        print(f"# {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB; "
              f"torch {torch.__version__}, triton {triton.__version__}")
    bandwidth = copy_bandwidth()
    print(f"measured copy bandwidth: {bandwidth / 1e12:.2f} TB/s (1 GiB device-to-device, read + write)")
    if device == "cpu":
        bandwidth = 1e11   # a placeholder so the smoke test prints numbers; no CPU figure is meant
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape_dir(Path(tmp) / f"llama-{args.shape}", SHAPES[args.shape])
        bench_ours(model_dir, args, bandwidth, device)
        if not args.skip_transformers:
            bench_transformers(model_dir, args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
