"""`/v1/completions` and `/v1/chat/completions`: validation, admission, streaming.

Admission, in order, before anything reaches the engine: API key (401), draining (503), model name (404),
request shape and sampling values (400), room in the waiting queue (429), the key's token quota (429).
Each (prompt, choice) pair is one engine request; a client that goes away aborts all of them.

Streams the router may resume (docs/router.md, "Streams that survive their replica"): with the router's
`x-kubeinfer-resumable` header, a stream of one choice without tools carries SSE comment lines that clients ignore
and the router strips: `: ki-id <id> <created>` first, then with every output `: ki <characters of text sent>
<new token ids>`. A request with `kubeinfer_resume` continues such a stream: the same id, no role chunk again,
text from where the client's stream stopped, usage counting the whole output once.

Room is reserved at admission, in the same event-loop turn as the check, and given back when the response ends,
however it ends (finished, failed, the client gone, a stream whose body never started): requests that arrive
together can never be admitted past the capacity.
"""
import asyncio
import time
import uuid
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.engine.messages import check_prompt, check_resumed_output, check_token_ids
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.server.engine_client import EngineClient
from kubeinfer.runtime.server.auth import KeyRing
from kubeinfer.runtime.server.chat import render_chat
from kubeinfer.runtime.server import lora_api
from kubeinfer.runtime.server.errors import APIError
from kubeinfer.runtime.server.metrics import EngineMetrics
from kubeinfer.runtime.router.resume import RESUMABLE_HEADER, id_line, progress_line
from kubeinfer.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, Resume
from kubeinfer.runtime.server.responses import Formatter, sse
from kubeinfer.runtime.server.responses_store import ResponseStore
from kubeinfer.runtime.server.tool_output import ToolOutput
from kubeinfer.runtime.server.tools import plan_tools
from kubeinfer.runtime.structured.spec import StructuredOutput
from kubeinfer.runtime.tokenizer import Tokenizer

RETRY_AFTER_FULL_SECONDS = 1.0
CLIENT_CLOSED_REQUEST = 499   # nginx's status for a client that left before the response (never sent: logged)


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: Tokenizer
    config: EngineConfig
    keys: KeyRing
    metrics: EngineMetrics
    draining: bool = False
    admitted: int = 0   # engine requests of admitted jobs whose responses have not ended
    responses: ResponseStore = field(default_factory=ResponseStore)   # /v1/responses with store: true
    loras: dict[str, str] = field(default_factory=dict)   # LoRA adapters served: name -> folder (lora_api.py)

    @property
    def capacity(self) -> int:
        """Requests the engine may hold: the running batch plus the bounded waiting queue."""
        return self.config.max_num_seqs + self.config.max_waiting_requests


@dataclass
class Job:
    request_id: str
    prompts: list[list[int]]
    params: list[SamplingParams]   # one per (prompt, choice), in choice-index order
    n: int
    key: str | None
    state: ServerState | None = None   # holds the job's room until `release`
    resume: Resume | None = None       # a continuation of a stream whose replica died

    def release(self) -> None:
        """Gives the job's room back (once, whichever path ends the response first)."""
        if self.state is not None:
            self.state.admitted -= len(self.params)
            self.state = None

    def sub_requests(self):
        for index, params in enumerate(self.params):
            yield index, f"{self.request_id}-{index}", self.prompts[index // self.n], params

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))


def authenticate(state: ServerState, request: Request) -> str | None:
    if not state.keys.enabled:
        return None
    key = state.keys.authenticate(request.headers.get("authorization"))
    if key is None:
        raise APIError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'", code="invalid_api_key")
    return key


def admit(state: ServerState, body, key: str | None, prompts: list[list[int]], max_tokens: int | None,
          logprobs: int | None, prefix: str, structured: StructuredOutput | None = None) -> Job:
    """Checks and reserves room for a request; `structured`: the tools' grammar, else the body's own format."""
    if state.draining:
        raise APIError(503, "the server is shutting down", code="draining")
    lora_name = lora_api.adapter_of(state, body.model)   # None: the base model; 404 for a name not served
    structured = structured or body.structured_output()
    max_len = state.engine.info.max_model_len
    params = []
    for prompt in prompts:
        check_prompt(prompt, state.engine.info)
        wanted = max_len - len(prompt) if max_tokens is None else max_tokens
        if len(prompt) + wanted > max_len:
            raise InvalidRequestError(f"max_tokens {wanted} plus the prompt's {len(prompt)} tokens exceeds this "
                                      f"model's {max_len}-token limit", "max_tokens")
        params.extend(body.sampling_params(wanted, logprobs, choice, structured) for choice in range(body.n))
        check_token_ids(params[-1], state.engine.info)
    tenant = state.keys.tenant(key)   # from the key alone: a client never names its own tenant
    for choice in params:
        choice.tenant, choice.tenant_weight, choice.priority = tenant.name, tenant.weight, tenant.priority
        choice.lora_name = lora_name
    if state.admitted + len(params) > state.capacity:
        raise APIError(429, "the server is at capacity; retry later", code="queue_full",
                       retry_after=RETRY_AFTER_FULL_SECONDS)
    resume = body.kubeinfer_resume
    if resume is not None:
        if not body.stream or len(params) != 1:
            raise InvalidRequestError("kubeinfer_resume continues a stream of one choice: stream true, n 1, "
                                      "one prompt", "kubeinfer_resume")
        check_resumed_output(prompts[0], resume.token_ids, params[0], state.engine.info)
    job = Job(f"{prefix}-{uuid.uuid4().hex}", prompts, params, body.n, key, resume=resume)
    wait = state.keys.retry_after(key, job.num_prompt_tokens)
    if wait is not None:
        raise APIError(429, f"token quota of {state.keys.limit(key)} tokens per minute exceeded",
                       code="quota_exceeded", retry_after=wait)
    state.keys.charge(key, job.num_prompt_tokens)
    state.admitted += len(params)   # no await since the check: nothing else was admitted in between
    job.state = state
    return job


async def completions(state: ServerState, body: CompletionRequest, request: Request):
    key = authenticate(state, request)
    if body.echo or body.suffix:
        raise InvalidRequestError("echo and suffix are not supported", "echo" if body.echo else "suffix")
    prompts = [state.tokenizer.encode(p) if isinstance(p, str) else p for p in body.prompts()]
    if not prompts:
        raise InvalidRequestError("the prompt is empty", "prompt")
    job = admit(state, body, key, prompts, body.max_tokens, body.logprobs, "cmpl")
    formatter = Formatter(False, *stream_identity(job), body.model, state.tokenizer, body.logprobs is not None)
    return await _respond(state, job, formatter, body, request)


async def chat_completions(state: ServerState, body: ChatCompletionRequest, request: Request):
    key = authenticate(state, request)
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, flat=False)
    structured = plan.structured_output() if plan else None
    if structured is not None and (body.response_format or {}).get("type", "text") != "text":
        raise InvalidRequestError("response_format cannot be combined with tool_choice required or a named function",
                                  "response_format")
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
    tokenizer = state.tokenizer
    text = render_chat(tokenizer.chat_template, [m.template_message(i) for i, m in enumerate(body.messages)],
                       body.add_generation_prompt, tokenizer.bos_token, tokenizer.eos_token,
                       plan.offered if plan else None)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    job = admit(state, body, key, [prompt], body.max_completion_tokens or body.max_tokens, logprobs, "chatcmpl",
                structured)
    tools = ToolOutput(plan, state.config.tool_call_parser) if plan and plan.choice != "none" else None
    if tools is not None and job.resume is not None:
        job.release()
        raise InvalidRequestError("a stream with tools cannot be resumed", "kubeinfer_resume")
    formatter = Formatter(True, *stream_identity(job), body.model, tokenizer, body.logprobs, tools)
    return await _respond(state, job, formatter, body, request)


def stream_identity(job: Job) -> tuple[str, int]:
    """The response's id and creation time: a continuation keeps those of the stream it resumes."""
    return (job.resume.id, job.resume.created) if job.resume else (job.request_id, int(time.time()))


async def _respond(state: ServerState, job: Job, formatter: Formatter, body, request: Request):
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        progress = (request.headers.get(RESUMABLE_HEADER.decode()) == "1" and len(job.params) == 1
                    and formatter.tools is None)
        return JobStream(job, _stream(state, job, formatter, include_usage, progress),
                         media_type="text/event-stream", headers={"Cache-Control": "no-cache",
                                                                  "X-Accel-Buffering": "no"})
    try:
        return await _collect(state, job, formatter, request)
    finally:
        job.release()


class JobStream(StreamingResponse):
    """A streamed response that gives its job's room back when it ends, even when its body never started."""

    def __init__(self, job: Job, content, **kwargs):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.release()


async def _collect(state: ServerState, job: Job, formatter: Formatter, request: Request):
    outputs = await gather_outputs(state, job, request)
    if outputs is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(formatter.response(outputs, job.num_prompt_tokens))


async def gather_outputs(state: ServerState, job: Job, request: Request) -> list[RequestOutput] | None:
    """The last output of each of the job's requests; None if the client went away first (they are aborted)."""
    async def collect(sub_id, prompt, params):
        last = None
        async for output in state.engine.generate(sub_id, prompt, params):
            last = output
        return last

    tasks = [asyncio.ensure_future(collect(sub_id, prompt, params)) for _, sub_id, prompt, params in job.sub_requests()]
    gathered = asyncio.gather(*tasks)
    disconnected = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({gathered, disconnected}, return_when=asyncio.FIRST_COMPLETED)
        if not gathered.done():   # the client went away: its requests are aborted (their blocks freed)
            gathered.cancel()
            return None
        outputs = gathered.result()
    finally:
        disconnected.cancel()
        for task in tasks:
            task.cancel()
    state.keys.charge(job.key, sum(len(o.token_ids) for o in outputs))
    return outputs


async def _wait_for_disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body was read already: the next ASGI message says so)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(state: ServerState, job: Job, formatter: Formatter, include_usage: bool, progress: bool):
    """The job's SSE events; `progress`: with the comment lines the router needs to resume the stream."""
    queue: asyncio.Queue = asyncio.Queue()
    resumed = len(job.resume.token_ids) if job.resume else 0   # output tokens the client had from elsewhere
    emitted = [0] * len(job.params)
    cached = [0] * len(job.params)   # prompt tokens each choice found in the prefix cache

    async def pump(index, sub_id, prompt, params):
        try:
            async for output in state.engine.generate(sub_id, prompt, params, job.resume):
                queue.put_nowait((index, output))
        except Exception as error:   # noqa: BLE001 - reported to the client as an error event
            queue.put_nowait((index, error))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(*sub)) for sub in job.sub_requests()]
    try:
        if progress:
            yield id_line(formatter.request_id, formatter.created)
        if formatter.chat and job.resume is None:
            for index in range(len(tasks)):
                yield formatter.role_chunk(index)
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                state.metrics.count_error(500)
                yield sse({"error": {"message": str(item), "type": "server_error", "param": None, "code": None}})
                return
            else:
                emitted[index] = len(item.token_ids)
                cached[index] = item.num_cached_tokens
                chunk = formatter.chunk(index, item)
                if progress:   # one event: what the client has once it has this chunk, then the chunk
                    chunk = progress_line(len(item.text), item.new_token_ids) + (chunk or "\n")
                if chunk:
                    yield chunk
        if include_usage:
            yield formatter.usage_chunk(job.num_prompt_tokens, sum(emitted), sum(cached))
        yield sse("[DONE]")
    finally:
        for task in tasks:
            task.cancel()
        state.keys.charge(job.key, sum(emitted) - resumed)
