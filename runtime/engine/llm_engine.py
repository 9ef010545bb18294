"""The engine in one process: requests in, one step at a time, text deltas out.

`step()` = the core's step (schedule -> run -> postprocess, token ids) -> the output processor
(detokenization and stop strings). Offline inference (`LLM`) and tests drive it directly; the server runs
the core in its own process instead (see `kubeinfer.runtime.server.engine_client`). Not thread-safe.
"""
import logging
import time

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.core import EngineCore
from kubeinfer.runtime.engine.messages import check_prompt
from kubeinfer.runtime.engine.output_processor import OutputProcessor, RequestOutput
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.tokenizer import Tokenizer, eos_token_ids

__all__ = ["LLMEngine", "RequestOutput"]
logger = logging.getLogger(__name__)


def log_startup_phases(phases: dict[str, float]) -> None:
    logger.info("start-up phases: %s", ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items()))


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.tokenizer = Tokenizer(config.model)
        self.eos_token_ids = eos_token_ids(config.model_config.eos_token_ids, self.tokenizer)
        self.core = EngineCore(config, self.eos_token_ids)
        self.processor = OutputProcessor(self.tokenizer)
        self.startup_phases = dict(self.core.info.startup_phases)
        log_startup_phases(self.startup_phases)

    # The core's parts, for tests and benchmarks.
    @property
    def model_runner(self):
        return self.core.model_runner

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def block_manager(self):
        return self.core.block_manager

    @property
    def requests(self):
        return self.processor.requests

    # -- requests ----------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.core.add(request_id, token_ids, params, arrival_time)
        self.processor.add(request_id, token_ids, params, arrival_time)

    def add_remote_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None,
                           source: str, arrival_time: float | None = None) -> None:
        """A request whose prompt is prefilled by the replica whose KV endpoint is `source` (`host:port`); this
        engine (kv_role decode) pulls the KV and decodes (docs/disaggregation.md)."""
        params = params or SamplingParams()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.core.add_remote(request_id, token_ids, params, source, arrival_time)
        self.processor.add(request_id, token_ids, params, arrival_time)

    def validate_prompt(self, token_ids: list[int]) -> None:
        check_prompt(token_ids, self.core.info)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        self.core.finish(request_id, "abort")
        return self.processor.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished() or len(self.processor) > 0

    def shutdown(self) -> None:
        """Stops the other tensor-parallel ranks, if any (also run at interpreter exit). Idempotent."""
        self.core.shutdown()

    # -- the step ------------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, stopped = self.processor.process(self.core.step())
        for request_id, stop in stopped:
            self.core.finish(request_id, "stop", stop)
        failures = self.core.take_failures()
        if self.core.kv_importer is not None:
            failures += self.core.kv_importer.take_failures()
        for request_id, message in failures:
            output = self.processor.abort(request_id)
            if output is not None:
                output.finish_reason, output.error = "error", message
                outputs.append(output)
        return outputs
