"""What structured output costs the engine per step: 64 sequences decoding under one JSON schema (sampled, so they
diverge), the grammar's part of each step (filling the batch's bitmask, applying it to the logits, the three loop
guards, advancing the matchers) against the whole step, and the same batch's plain step for reference. Steps where all
sequences decode are counted. Fixed seeds; prints its figures.

    python benchmarks/structured_mask_cost.py [--batch 64] [--model demo] [--vocab 32000] [--device cuda]
    python benchmarks/structured_mask_cost.py --batch 16 --model ~/.cache/kubeinfer/models/smollm2-135m-instruct-v1
    python benchmarks/structured_mask_cost.py --batch 16 --shape qwen2.5-0.5b

`--vocab N` builds a demo-shaped model around an N-token byte-level BPE (trained here on the standard library's
sources), to see the mask at a real vocabulary's size; `--shape NAME` (benchmarks/shapes.py) a model of that real
shape with dummy weights around a BPE of the shape's vocabulary, so the step is the real shape's too.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine import core as core_module
from kubeinfer.runtime.engine.llm_engine import LLMEngine
from kubeinfer.runtime.layers import sampler as sampler_module
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.structured.formats import response_format_output

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grammar_libraries  # noqa: E402

SCHEMA = grammar_libraries.SCHEMA   # one schema for both structured-output benchmarks
PARTS = ("mask", "loops", "strings", "keys", "advance")
spent = dict.fromkeys(PARTS, 0.0)   # seconds in each grammar part during the current step


def timed(name: str, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - started
    return wrapper


def run(engine: LLMEngine, batch: int, structured) -> tuple[list[float], ...]:
    """Each counted step's seconds, then each grammar part's seconds in it (PARTS' order)."""
    for i in range(batch):
        params = SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured=structured,
                                ignore_eos=structured is None)
        engine.add_request(str(i), f"request {i}: a person as JSON", params)
    steps, parts = [], {name: [] for name in PARTS}
    while engine.has_unfinished_requests():
        decoding = (len(engine.scheduler.running) == batch and not engine.scheduler.waiting
                    and all(seq.num_output_tokens > 0 for seq in engine.scheduler.running))
        spent.update(dict.fromkeys(PARTS, 0.0))
        started = time.perf_counter()
        engine.step()
        if decoding:
            steps.append(time.perf_counter() - started)
            for name in PARTS:
                parts[name].append(spent[name])
    return steps, *parts.values()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--shape", default=None, help="a real shape of benchmarks/shapes.py, with dummy weights")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the demo model's own dtype; graphs on CUDA)")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch's CPU threads (default: torch's)")
    args = parser.parse_args()
    model = args.model
    if args.vocab is not None:
        sys.path.insert(0, str(Path(__file__).parent))   # python -P leaves the script's folder out
        from grammar_libraries import big_tokenizer
        from kubeinfer.runtime.demo import write_llama_model
        model = str(Path(tempfile.mkdtemp()) / f"demo-{args.vocab}")
        write_llama_model(Path(model), big_tokenizer(args.vocab))
    load_format = "auto"
    if args.shape is not None:
        from grammar_libraries import big_tokenizer
        from shapes import SHAPES, write_shape_dir
        from kubeinfer.runtime.demo import save_tokenizer
        model = write_shape_dir(Path(tempfile.mkdtemp()) / args.shape, args.shape)
        save_tokenizer(big_tokenizer(SHAPES[args.shape]["vocab_size"]), model)
        model, load_format = str(model), "dummy"
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    sampler_module.apply_grammars = timed("mask", sampler_module.apply_grammars)
    sampler_module.ban_loops = timed("loops", sampler_module.ban_loops)
    sampler_module.close_looping_strings = timed("strings", sampler_module.close_looping_strings)
    sampler_module.end_repeating_objects = timed("keys", sampler_module.end_repeating_objects)
    advance = core_module.EngineCore._advance_grammars
    core_module.EngineCore._advance_grammars = staticmethod(timed("advance", advance))
    engine = LLMEngine(EngineConfig(model=model, device=args.device, max_num_seqs=args.batch, max_model_len=512,
                                    max_num_batched_tokens=args.batch * 64, load_format=load_format,
                                    kv_cache_memory_gib=1.0 if args.device == "cpu" else None))
    structured = response_format_output({"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
    run(engine, args.batch, structured)   # warm-up: the grammar compiled, the allocator warm
    plain = run(engine, args.batch, None)[0]
    steps, masks, loops, strings, keys, advances = run(engine, args.batch, structured)
    grammar = [sum(parts) for parts in zip(masks, loops, strings, keys, advances)]
    ms = lambda values: statistics.median(values) * 1e3   # noqa: E731
    tokens = engine.tokenizer.vocab_size if hasattr(engine, "tokenizer") else "?"
    print(f"model {model} (vocab {engine.config.model_config.vocab_size}, tokenizer {tokens}), batch {args.batch}, "
          f"{args.device}, "
          f"torch threads {torch.get_num_threads()}, {len(steps)} constrained decode steps counted")
    print(f"plain decode step        {ms(plain):8.2f} ms (median)")
    print(f"constrained decode step  {ms(steps):8.2f} ms")
    print(f"  bitmask fill + apply   {ms(masks):8.2f} ms")
    print(f"  loop guard             {ms(loops):8.2f} ms")
    print(f"  string loop guard      {ms(strings):8.2f} ms")
    print(f"  repeated-key guard     {ms(keys):8.2f} ms")
    print(f"  matchers advanced      {ms(advances):8.2f} ms")
    print(f"  grammar share of step  {statistics.median(g / s for g, s in zip(grammar, steps)) * 100:8.1f} %")


if __name__ == "__main__":
    main()
