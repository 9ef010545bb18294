"""The engine: requests in, one scheduler step at a time, text deltas out.

`step()` = `scheduler.schedule()` -> `model_runner.run()` -> `scheduler.postprocess()`, then
detokenization and stop strings. Not thread-safe: one caller drives it (the server runs it on its own thread).
"""
import logging
import time
from dataclasses import dataclass, field

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.model_runner import ModelRunner
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.layers.sampler import TokenLogprobs
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.tokenizer import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]                # every output token so far
    text: str                           # output text so far; a matched stop string is cut off
    new_token_ids: list[int]            # since this request's previous output
    new_text: str
    new_logprobs: list[TokenLogprobs]
    logprobs: list[TokenLogprobs]       # every output position so far (when the request asked for them)
    finished: bool
    finish_reason: str | None           # "stop", "length" or "abort"
    stop_reason: str | int | None       # the stop string or stop token id that ended it
    num_cached_tokens: int
    arrival_time: float
    first_token_time: float | None


@dataclass
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    text: str = ""
    num_emitted_chars: int = 0
    num_emitted_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.tokenizer = Tokenizer(config.model)
        self.model_runner = ModelRunner(config)
        self.startup_phases = dict(self.model_runner.startup_phases)
        logger.info("start-up phases: %s", ", ".join(f"{name} {seconds:.2f} s"
                                                     for name, seconds in self.startup_phases.items()))
        eos = config.model_config.eos_token_ids
        if not eos and self.tokenizer.eos_token_id is not None:
            eos = (self.tokenizer.eos_token_id,)
        self.eos_token_ids = eos
        self.block_manager = BlockManager(self.model_runner.num_blocks, config.block_size, config.max_num_seqs,
                                          config.max_blocks_per_seq, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, eos)
        self.requests: dict[str, _Request] = {}

    # -- requests ----------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.validate_prompt(token_ids)
        seq = Sequence(request_id, token_ids, params, arrival_time)
        self.requests[request_id] = _Request(seq, IncrementalDetokenizer(self.tokenizer, token_ids,
                                                                        params.skip_special_tokens))
        self.scheduler.add(seq)

    def validate_prompt(self, token_ids: list[int]) -> None:
        config = self.config
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if len(token_ids) >= config.max_model_len:
            raise InvalidRequestError(f"the prompt has {len(token_ids)} tokens; this model serves at most "
                                      f"{config.max_model_len} tokens in all (prompt and output)", "prompt")
        vocab = config.model_config.vocab_size
        if min(token_ids) < 0 or max(token_ids) >= vocab:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
        if len(token_ids) > self.block_manager.num_blocks * config.block_size:
            raise InvalidRequestError(f"the prompt has {len(token_ids)} tokens, more than the whole KV cache "
                                      f"holds ({self.block_manager.num_blocks * config.block_size})", "prompt")

    def abort_request(self, request_id: str) -> RequestOutput | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        self.scheduler.finish([request.seq], "abort")
        return self._output(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def shutdown(self) -> None:
        """Stops the other tensor-parallel ranks, if any (also run at interpreter exit). Idempotent."""
        self.model_runner.shutdown()

    # -- the step ------------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        sampled, logprobs = self.model_runner.run(batch, self.block_manager)
        self.scheduler.postprocess(batch, sampled)
        now = time.monotonic()
        outputs = []
        for seq, token, token_logprobs in zip(batch.seqs, sampled, logprobs):
            if token is None:
                continue
            request = self.requests[seq.request_id]
            if seq.first_token_time is None:
                seq.first_token_time = now
            if token_logprobs is not None:
                request.logprobs.append(token_logprobs)
            self._detokenize(request)
            outputs.append(self._output(request))
            if seq.is_finished:
                del self.requests[seq.request_id]
        return outputs

    def _detokenize(self, request: _Request) -> None:
        seq, stops = request.seq, request.seq.params.stop
        delta = request.detokenizer.step(seq.token_ids)
        if seq.is_finished:
            delta += request.detokenizer.flush(seq.token_ids)
        request.text += delta
        if stops and delta:
            longest = max(len(stop) for stop in stops)
            search_from = max(0, len(request.text) - len(delta) - longest + 1)
            found = [(request.text.find(stop, search_from), stop) for stop in stops]
            found = [(index, stop) for index, stop in found if index >= 0]
            if found:
                index, stop = min(found)
                request.text = request.text[:index]
                seq.stop_reason = stop
                self.scheduler.finish([seq], "stop")

    def _output(self, request: _Request) -> RequestOutput:
        seq = request.seq
        # Text that may be the start of a stop string is held back until it is known not to be one.
        visible = len(request.text)
        if seq.params.stop and not seq.is_finished:
            visible = max(request.num_emitted_chars, visible - max(len(stop) for stop in seq.params.stop) + 1)
        output_ids = seq.output_token_ids
        output = RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.token_ids[:seq.num_prompt_tokens],
            token_ids=output_ids, text=request.text[:visible],
            new_token_ids=output_ids[request.num_emitted_tokens:],
            new_text=request.text[request.num_emitted_chars:visible],
            new_logprobs=request.logprobs[request.num_emitted_tokens:], logprobs=list(request.logprobs),
            finished=seq.is_finished,
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            num_cached_tokens=seq.num_cached_tokens, arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time)
        request.num_emitted_chars, request.num_emitted_tokens = visible, len(output_ids)
        return output
