"""How a real trained model writes under each JSON layout a grammar may impose: SmolLM2-135M-Instruct answers twenty
pydantic schemas (tests/support/pydantic_cases.py) and six population prompts, greedy and sampled, with

    compact   no whitespace between JSON tokens (our layout before issue #50)
    bounded   nothing, one space, or a newline and up to 4 x (depth + 1) spaces (runtime/structured/json_layout.py)
    free      any whitespace, unbounded (llguidance's default, what vLLM's xgrammar/guidance backends allow)
    none      no grammar at all: the model's own text (valid only where it happens to be the JSON alone)

and prints, per layout: answers that validate, answers cut by max_tokens, mean tokens, and the share of output
characters that are whitespace between JSON tokens; the compact and bounded layouts' cut answers, their last 300
characters each, go to stderr. Offline (the LLM class), fp32, one batch per layout and run.

    python -P benchmarks/structured_quality.py [--max-tokens 256] [--seeds 3]
"""
import argparse
import json
import re
import sys
import time
from pathlib import Path

import jsonschema
import llguidance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.pydantic_cases import CASES  # noqa: E402

from kubeinfer.runtime.llm import LLM  # noqa: E402
from kubeinfer.runtime.sampling_params import SamplingParams  # noqa: E402
from kubeinfer.runtime.server.chat import render_chat  # noqa: E402
from kubeinfer.runtime.structured.enforceable import enforceable  # noqa: E402
from kubeinfer.runtime.structured.json_layout import layout_options  # noqa: E402
from kubeinfer.runtime.structured.spec import StructuredOutput  # noqa: E402
from kubeinfer.runtime.trained_models import smollm2_dir  # noqa: E402

POPULATION = CASES[0][0]
POPULATION_PROMPTS = ["What is the capital of France and its population? Reply in JSON.", "Tell me about Paris.",
                      "Paris population in millions, as JSON.",
                      "Which city is the capital of France? How many people live there?",
                      "Describe the largest city of Japan in JSON.", "Give me a JSON object about Berlin."]
LAYOUTS = {
    "compact": lambda schema: {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"},
    "bounded": layout_options,
    "free": lambda schema: {"whitespace_flexible": True},
    "none": None,
}
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


def grammar(schema: dict, layout: str) -> StructuredOutput | None:
    if LAYOUTS[layout] is None:
        return None
    grammar_schema, _ = enforceable(schema)
    text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(grammar_schema),
                                                         overrides=LAYOUTS[layout](grammar_schema))
    return StructuredOutput(text, "json_schema", json.dumps(schema))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=3, help="sampled runs (temperature 0.7) beside the greedy one")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    args = parser.parse_args()
    cases = [(model.model_json_schema(), question) for model, question in CASES]
    cases += [(POPULATION.model_json_schema(), question) for question in POPULATION_PROMPTS]
    with LLM(str(smollm2_dir()), kv_cache_memory_gib=1.0, max_model_len=2048) as llm:
        tokenizer = llm.tokenizer
        prompts = [render_chat(tokenizer.chat_template, [{"role": "user", "content": q}], True, tokenizer.bos_token,
                               tokenizer.eos_token) for _, q in cases]
        print(f"{len(cases)} prompts; greedy and {args.seeds} sampled runs (temperature 0.7) each; "
              f"max_tokens {args.max_tokens}")
        print("| layout | run | valid | cut by max_tokens | mean tokens | whitespace share | seconds |")
        print("|---|---|---|---|---|---|---|")
        for layout in args.layouts:
            outputs = [grammar(schema, layout) for schema, _ in cases]
            for run in ["greedy"] + [f"seed {s}" for s in range(args.seeds)]:
                sampling = ({"temperature": 0} if run == "greedy"
                            else {"temperature": 0.7, "seed": int(run.split()[1])})
                params = [SamplingParams(max_tokens=args.max_tokens, structured=structured, **sampling)
                          for structured in outputs]
                started = time.perf_counter()
                results = llm.generate(prompts, params)
                elapsed = time.perf_counter() - started
                valid = cut = spaces = chars = 0
                for (schema, _), result in zip(cases, results):
                    cut += result.finish_reason == "length"
                    try:
                        jsonschema.validate(json.loads(result.text), schema)
                        valid += 1
                    except (json.JSONDecodeError, jsonschema.ValidationError):
                        pass
                    outside = STRINGS.sub('""', result.text)
                    spaces += len(re.findall(r"\s", outside))
                    chars += len(result.text)
                    if layout in ("compact", "bounded") and result.finish_reason == "length":
                        print(f"  cut ({layout}, {run}): {result.text[-300:]!r}", file=sys.stderr)
                mean = sum(len(r.token_ids) for r in results) / len(results)
                print(f"| {layout} | {run} | {valid}/{len(cases)} | {cut}/{len(cases)} | {mean:.0f} | "
                      f"{spaces / max(chars, 1):.0%} | {elapsed:.0f} |", flush=True)


if __name__ == "__main__":
    main()
