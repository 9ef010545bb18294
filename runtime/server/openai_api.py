"""`/v1/completions` and `/v1/chat/completions`: the request into engine requests (admission: admission.py), the
response, streamed or whole. Each (prompt, choice) pair is one engine request; a client that goes away aborts all
of them.

Streams the router may resume (docs/router.md, "Streams that survive their replica"): with the router's
`x-kubeinfer-resumable` header, a stream of one choice without tools carries SSE comment lines that clients ignore
and the router strips: `: ki-id <id> <created>` first, then with every output `: ki <characters of text sent>
<new token ids>`. A request with `kubeinfer_resume` continues such a stream: the same id, no role chunk again,
text from where the client's stream stopped, usage counting the whole output once.

A request with `kubeinfer_kv_source` (a decode replica; kv_source.py) waits for its first output before its
response starts, so a failed KV transfer is a 502 answer, never a stream cut short.
"""
import asyncio
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.router.resume import RESUMABLE_HEADER, failed_event, id_line, progress_line
from kubeinfer.runtime.server.admission import Job, ServerState, admit, authenticate
from kubeinfer.runtime.server.chat import render_chat
from kubeinfer.runtime.server.engine_client import EngineDeadError
from kubeinfer.runtime.server.errors import APIError, error_body
from kubeinfer.runtime.server.kv_source import start_pulled
from kubeinfer.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from kubeinfer.runtime.server.request_trace import begin, failing
from kubeinfer.runtime.server.responses import Formatter, sse
from kubeinfer.runtime.server.tool_output import ToolOutput
from kubeinfer.runtime.server.tools import plan_tools

CLIENT_CLOSED_REQUEST = 499   # nginx's status for a client that left before the response (never sent: logged)


async def completions(state: ServerState, body: CompletionRequest, request: Request):
    trace = begin(request, "text_completion", body)
    with failing(trace):
        caller = authenticate(state, request)
        if body.echo or body.suffix:
            raise InvalidRequestError("echo and suffix are not supported", "echo" if body.echo else "suffix")
        prompts = [state.tokenizer.encode(p) if isinstance(p, str) else p for p in body.prompts()]
        if not prompts:
            raise InvalidRequestError("the prompt is empty", "prompt")
        job = traced(admit(state, body, caller, prompts, body.max_tokens, body.logprobs, "cmpl"), trace, caller)
        formatter = Formatter(False, *stream_identity(job), body.model, state.tokenizer, body.logprobs is not None)
        return await _respond(state, job, formatter, body, request)


async def chat_completions(state: ServerState, body: ChatCompletionRequest, request: Request):
    trace = begin(request, "chat", body)
    with failing(trace):
        return await _chat_completions(state, body, request, trace)


async def _chat_completions(state: ServerState, body: ChatCompletionRequest, request: Request, trace):
    caller = authenticate(state, request)
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, flat=False)
    structured = plan.structured_output(state.config.json_layout) if plan else None
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
    job = traced(admit(state, body, caller, [prompt], body.max_completion_tokens or body.max_tokens, logprobs,
                       "chatcmpl", structured), trace, caller)
    tools = ToolOutput(plan, state.config.tool_call_parser) if plan and plan.choice != "none" else None
    if tools is not None and job.resume is not None:
        job.release()
        raise InvalidRequestError("a stream with tools cannot be resumed", "kubeinfer_resume")
    formatter = Formatter(True, *stream_identity(job), body.model, tokenizer, body.logprobs, tools)
    return await _respond(state, job, formatter, body, request)


def traced(job: Job, trace, caller) -> Job:
    """`job`, carrying its request's trace (admission ends here)."""
    if trace is not None:
        job.trace = trace
        trace.admitted(job.request_id, caller.tenant.name, job.kv_source, job.num_prompt_tokens)
        if job.kv_source is not None:   # the KV pull carries the request's context to the prefill replica
            for params in job.params:
                params.trace_context = trace.traceparent()
    return job


def stream_identity(job: Job) -> tuple[str, int]:
    """The response's id and creation time: a continuation keeps those of the stream it resumes."""
    return (job.resume.id, job.resume.created) if job.resume else (job.request_id, int(time.time()))


async def _respond(state: ServerState, job: Job, formatter: Formatter, body, request: Request):
    if job.kv_source is not None:
        try:
            if not await start_pulled(state, job, request):
                job.release()
                if job.trace is not None:
                    job.trace.finish([], cancelled=True)
                return Response(status_code=CLIENT_CLOSED_REQUEST)
        except BaseException:
            job.release()
            raise
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
        await job.close_primed()
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
            await self.job.close_primed()
            self.job.release()
            if self.job.trace is not None:   # the client left while the stream waited: what it kept, cancelled
                self.job.trace.finish(cancelled=True)


async def _collect(state: ServerState, job: Job, formatter: Formatter, request: Request):
    outputs = await gather_outputs(state, job, request)
    if outputs is None:
        if job.trace is not None:
            job.trace.finish([], cancelled=True)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if job.trace is not None:
        job.trace.finish(outputs)
    return JSONResponse(formatter.response(outputs, job.num_prompt_tokens))


async def gather_outputs(state: ServerState, job: Job, request: Request) -> list[RequestOutput] | None:
    """The last output of each of the job's requests; None if the client went away first (they are aborted)."""
    async def collect(sub_id, prompt, params):
        last = None
        async for output in job.outputs(state.engine, sub_id, prompt, params):
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
    last: list[RequestOutput | None] = [None] * len(job.params)   # each choice's latest output (for its trace)
    if job.trace is not None:
        job.trace.outputs = last
    ended = False   # the stream ran to its last event (else the client went away, or it failed)

    async def pump(index, sub_id, prompt, params):
        try:
            async for output in job.outputs(state.engine, sub_id, prompt, params):
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
            elif isinstance(item, APIError):   # a finished answer that broke its schema (checked_answers)
                state.metrics.count_error(item.status)
                if job.trace is not None:
                    job.trace.fail(item)
                yield sse(error_body(item.status, item.message, item.param, item.code))
                return
            elif isinstance(item, Exception):
                state.metrics.count_error(500)
                if job.trace is not None:
                    job.trace.fail(item)
                event = sse({"error": {"message": str(item), "type": "server_error", "param": None, "code": None}})
                yield failed_event(event) if progress and isinstance(item, EngineDeadError) else event
                return
            else:
                last[index] = item
                emitted[index] = len(item.token_ids)
                cached[index] = item.num_cached_tokens
                chunk = formatter.chunk(index, item)
                if progress:   # one event: what the client has once it has this chunk, then the chunk
                    chunk = progress_line(len(item.text), item.new_token_ids) + (chunk or "\n")
                if chunk:
                    yield chunk
        if include_usage:
            yield formatter.usage_chunk(job.num_prompt_tokens, sum(emitted), sum(cached))
        ended = True
        if job.trace is not None:   # before the last line: once a client (a router) has it, the span has ended
            job.trace.finish()
        yield sse("[DONE]")
    finally:
        for task in tasks:
            task.cancel()
        state.keys.charge(job.key, sum(emitted) - resumed)
        if job.trace is not None:
            job.trace.finish(cancelled=not ended)
