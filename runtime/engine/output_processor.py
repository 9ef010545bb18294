"""Token ids to text: incremental detokenization, stop strings, and the `RequestOutput` each step yields.

Runs wherever the text is needed: beside the core in `LLMEngine`, or in the API process while the core
runs in its own. A stop string found in the text ends the request here at once; the caller then tells the
core (`stopped`), which may meanwhile have computed a token more: tokens of a finished request are ignored.
"""
from dataclasses import dataclass, field

from kubeinfer.runtime.engine.messages import TokenDelta, TokenLogprobs
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.tokenizer import IncrementalDetokenizer, Tokenizer


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
    tenant: str = ""                    # whose request (SamplingParams.tenant), for per-tenant metrics
    error: str | None = None            # why it ended with finish_reason "error" (a failed KV transfer)
    scheduled_time: float | None = None  # when the engine first scheduled it (monotonic clock)


@dataclass
class _Request:
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    detokenizer: IncrementalDetokenizer
    token_ids: list[int]                # prompt and output, as the detokenizer reads them
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_emitted_chars: int = 0
    num_emitted_tokens: int = 0
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    scheduled_time: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.requests: dict[str, _Request] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float,
            resumed_token_ids: list[int] = (), resumed_chars: int = 0) -> None:
        """A resumed request (its replica died mid-stream) brings the output tokens it had and how many characters
        of their text its client already got: its text is rebuilt as if it had produced them here, and its
        outputs start after them (logprobs only for the tokens produced here)."""
        prompt = list(prompt_token_ids)
        request = _Request(prompt, params, arrival_time,
                           IncrementalDetokenizer(self.tokenizer, prompt, params.skip_special_tokens), list(prompt))
        for token in resumed_token_ids:
            request.token_ids.append(token)
            request.text += request.detokenizer.step(request.token_ids)
        if resumed_chars > len(request.text):
            raise InvalidRequestError(f"the resumed output's text has {len(request.text)} characters, not "
                                      f"{resumed_chars}", "kubeinfer_resume")
        request.num_emitted_chars, request.num_emitted_tokens = resumed_chars, len(resumed_token_ids)
        request.logprobs = [None] * len(resumed_token_ids)
        self.requests[request_id] = request

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.requests

    def __len__(self) -> int:
        return len(self.requests)

    def process(self, deltas: list[TokenDelta]) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """The outputs of one step, one per request (with all the tokens it got: several under speculation),
        and `(request_id, stop string)` of the requests a stop string ended."""
        touched: dict[str, _Request] = {}
        stopped = []
        for delta in deltas:
            request = self.requests.get(delta.request_id)
            if request is None or request.finish_reason is not None:   # ended already (stop string, abort)
                continue
            request.token_ids.append(delta.token_id)
            request.num_cached_tokens = delta.num_cached_tokens
            request.first_token_time = delta.first_token_time
            request.scheduled_time = delta.scheduled_time
            if delta.logprobs is not None:
                request.logprobs.append(delta.logprobs)
            if delta.finish_reason is not None:
                request.finish_reason, request.stop_reason = delta.finish_reason, delta.stop_reason
            stop = self._detokenize(request)
            if stop is not None:
                stopped.append((delta.request_id, stop))
            touched[delta.request_id] = request
        outputs = []
        for request_id, request in touched.items():
            outputs.append(self._output(request_id, request))
            if request.finish_reason is not None:
                del self.requests[request_id]
        return outputs, stopped

    def abort(self, request_id: str) -> RequestOutput | None:
        """Ends a request (client gone, refused); its last output, or None if it had already ended."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        request.finish_reason = "abort"
        return self._output(request_id, request)

    def _detokenize(self, request: _Request) -> str | None:
        """Appends the new text; returns the stop string that ends the request, if one appeared."""
        stops = request.params.stop
        delta = request.detokenizer.step(request.token_ids)
        if request.finish_reason is not None:
            delta += request.detokenizer.flush(request.token_ids)
        request.text += delta
        if not (stops and delta):
            return None
        longest = max(len(stop) for stop in stops)
        search_from = max(0, len(request.text) - len(delta) - longest + 1)
        found = [(request.text.find(stop, search_from), stop) for stop in stops]
        found = [(index, stop) for index, stop in found if index >= 0]
        if not found:
            return None
        index, stop = min(found)
        request.text = request.text[:index]
        request.finish_reason, request.stop_reason = "stop", stop
        return stop

    @staticmethod
    def _output(request_id: str, request: _Request) -> RequestOutput:
        finished = request.finish_reason is not None
        # Text that may be the start of a stop string is held back until it is known not to be one.
        visible = len(request.text)
        if request.params.stop and not finished:
            visible = max(request.num_emitted_chars, visible - max(len(stop) for stop in request.params.stop) + 1)
        output_ids = request.output_token_ids
        output = RequestOutput(
            request_id=request_id, prompt_token_ids=request.prompt_token_ids, token_ids=output_ids,
            text=request.text[:visible], new_token_ids=output_ids[request.num_emitted_tokens:],
            new_text=request.text[request.num_emitted_chars:visible],
            new_logprobs=request.logprobs[request.num_emitted_tokens:], logprobs=list(request.logprobs),
            finished=finished, finish_reason=request.finish_reason, stop_reason=request.stop_reason,
            num_cached_tokens=request.num_cached_tokens, arrival_time=request.arrival_time,
            scheduled_time=request.scheduled_time,
            first_token_time=request.first_token_time, tenant=request.params.tenant)
        request.num_emitted_chars, request.num_emitted_tokens = visible, len(output_ids)
        return output
