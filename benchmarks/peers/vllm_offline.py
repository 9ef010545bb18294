"""Runs vLLM's offline `LLM.generate` on a workload file and prints its timing as one JSON line.

Run by benchmarks/throughput.py inside vLLM's own venv (never a dependency of kubeinfer):

    VENV/bin/python benchmarks/peers/vllm_offline.py WORKLOAD.json

The workload file holds the model folder, the prompts as token ids, the output lengths and vLLM's settings.
Like ours, it warms up on the first two requests, then times all of them (greedy, ignore_eos) twice: the
first pass on prompts it has not seen, the second on the same prompts again (every prefix cached).
"""
import json
import sys
import time


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    started = time.perf_counter()
    llm = LLM(model=spec["model"], **spec["settings"])
    startup = time.perf_counter() - started
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in spec["outputs"]]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)   # warm-up
    passes = []
    for _ in range(2):
        started = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        passes.append(time.perf_counter() - started)
        lengths = [len(r.outputs[0].token_ids) for r in results]
        assert lengths == spec["outputs"], "vLLM did not generate the requested lengths"
    tokens = [list(r.outputs[0].token_ids) for r in results]
    print("RESULT " + json.dumps({"seconds": passes[0], "cached_seconds": passes[1], "startup_seconds": startup,
                                  "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
