"""Offline throughput: ours vs transformers.generate, on the same random-weight model, in one run.

Workload (fixed seed), like `vllm bench throughput`: random prompt tokens, mixed prompt and output lengths,
ignore_eos. transformers runs the requests in padded batches (left padding), each batch generating up to
its longest requested output; only the requested tokens count for both.

    python benchmarks/throughput.py [--num-requests 64] [--hf-batch-size 16]
"""
import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from kubeinfer.runtime.demo import train_tokenizer, write_llama_model
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams


def build_model(path: Path, hidden: int, layers: int) -> Path:
    write_llama_model(path, train_tokenizer(vocab_size=1024), hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 128, head_dim=64, max_position_embeddings=4096)
    return path


def workload(num: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(32, 512))] for _ in range(num)]
    outputs = [rng.randint(16, 256) for _ in range(num)]
    return prompts, outputs


def run_ours(model: Path, prompts, outputs) -> float:
    llm = LLM(str(model), max_num_seqs=256, max_num_batched_tokens=2048)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in outputs]
    llm.generate(prompts[:2], params[:2])   # warm-up
    started = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - started
    assert [len(r.token_ids) for r in results] == outputs
    return elapsed


def run_transformers(model: Path, prompts, outputs, batch_size: int) -> float:
    import transformers as tf
    hf = tf.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    hf.generate(torch.tensor([prompts[0][:8]]), max_new_tokens=2, do_sample=False, pad_token_id=0)   # warm-up
    started = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        batch, wanted = prompts[start:start + batch_size], outputs[start:start + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(wanted), min_new_tokens=max(wanted),
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        assert out.shape[1] == width + max(wanted)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", args.hidden, args.layers)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        prompts, outputs = workload(args.num_requests, vocab)
        prompt_tokens, output_tokens = sum(map(len, prompts)), sum(outputs)
        print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
              f"torch {torch.__version__}; model: Llama hidden {args.hidden}, {args.layers} layers, fp32, CPU")
        print(f"workload: {len(prompts)} requests, {prompt_tokens} prompt + {output_tokens} output tokens")
        ours = run_ours(model, prompts, outputs)
        theirs = run_transformers(model, prompts, outputs, args.hf_batch_size)
    print(f"{'engine':<28}{'seconds':>9}{'output tok/s':>14}{'total tok/s':>13}")
    for name, seconds in (("kubeinfer", ours), (f"transformers (batch {args.hf_batch_size})", theirs)):
        print(f"{name:<28}{seconds:>9.2f}{output_tokens / seconds:>14.1f}{(prompt_tokens + output_tokens) / seconds:>13.1f}")
    print(f"speed-up: {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
