"""Offline inference: `LLM(model_dir, **engine_settings).generate(prompts, sampling_params)`."""
import itertools
import sys
import time

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.llm_engine import LLMEngine, RequestOutput
from kubeinfer.runtime.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **engine_settings):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_settings))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def load_lora(self, name: str, path: str) -> None:
        """Serves the PEFT adapter at `path` as `name`: SamplingParams(lora_name=name) then runs on it."""
        self.engine.core.load_lora(name, path)

    def unload_lora(self, name: str) -> bool:
        return self.engine.core.unload_lora(name)

    def sleep(self, level: int = 1) -> dict:
        """Frees the KV cache and moves (1) or drops (2) the weights (docs/runtime.md, "Sleep"); the next request
        wakes the engine, or `wake_up()`."""
        return self.engine.core.sleep(level)

    def wake_up(self) -> dict:
        return self.engine.core.wake_up()

    def shutdown(self) -> None:
        """Stops the other tensor-parallel ranks, if any (also run at interpreter exit). Idempotent."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def generate(self, prompts: str | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 show_progress: bool = False) -> list[RequestOutput]:
        """Runs every prompt to completion; returns the final outputs in the prompts' order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        for request_id, prompt, p in zip(ids, prompts, params):
            self.engine.add_request(request_id, prompt, p)
        finals: dict[str, RequestOutput] = {}
        started, num_tokens = time.monotonic(), 0
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                num_tokens += len(output.new_token_ids)
                if output.finished:
                    finals[output.request_id] = output
            if show_progress:
                elapsed = time.monotonic() - started
                sys.stderr.write(f"\rgenerate: {len(finals)}/{len(ids)} requests done, "
                                 f"{num_tokens / max(elapsed, 1e-9):.0f} tokens/s")
        if show_progress:
            sys.stderr.write("\n")
        return [finals[request_id] for request_id in ids]
