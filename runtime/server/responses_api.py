"""`POST /v1/responses` (the Responses API), and `GET`/`DELETE /v1/responses/{id}` of stored responses.

The input items (after the stored conversation of `previous_response_id`, if any; `instructions` first, as a
system message, and never carried over) are rendered with the chat template, admitted like a chat completion
(`admission.admit`: same 401/503/404/400/429 order), and generated as one engine request. Unsupported fields are
refused with 400 (`ResponsesRequest.check_unsupported`).
"""
import logging
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.server.chat import render_chat
from kubeinfer.runtime.server.errors import APIError
from kubeinfer.runtime.server.admission import Job, ServerState, admit, authenticate
from kubeinfer.runtime.server.openai_api import CLIENT_CLOSED_REQUEST, JobStream, gather_outputs, traced
from kubeinfer.runtime.server.request_trace import begin, failing
from kubeinfer.runtime.server.responses_object import (ResponseBuilder, function_call_item, message_item, new_id,
                                                      response_usage)
from kubeinfer.runtime.server.responses_protocol import ResponsesRequest, item_messages
from kubeinfer.runtime.server.responses_store import StoredResponse
from kubeinfer.runtime.server.tool_output import ToolOutput
from kubeinfer.runtime.server.tools import plan_tools

logger = logging.getLogger(__name__)
INCOMPLETE_REASONS = {"length": "max_output_tokens"}


async def create_response(state: ServerState, body: ResponsesRequest, request: Request):
    trace = begin(request, "chat", body)
    with failing(trace):
        return await _create_response(state, body, request, trace)


async def _create_response(state: ServerState, body: ResponsesRequest, request: Request, trace):
    caller = authenticate(state, request)
    body.check_unsupported()
    history: list[dict] = []
    if body.previous_response_id is not None:
        stored = state.responses.get(body.previous_response_id, caller.tenant.name)
        if stored is None:
            raise APIError(
                404, f"previous response {body.previous_response_id!r} is not stored on this replica (responses are "
                     f"kept in memory, the newest {state.responses.capacity} for {state.responses.ttl_s:.0f} s, only "
                     f"with store: true, and only for the tenant that made them)", "previous_response_id",
                "not_found")
        history = stored.messages
    conversation = history + item_messages(body.input_items())
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, flat=True)
    structured = plan.structured_output(state.config.json_layout) if plan else None
    if structured is not None and body.text_format.get("type") != "text":
        raise InvalidRequestError("text.format cannot be combined with tool_choice required or a named function",
                                  "text.format")
    tokenizer = state.tokenizer
    text = render_chat(tokenizer.chat_template, messages, True, tokenizer.bos_token, tokenizer.eos_token,
                       plan.offered if plan else None)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    job = traced(admit(state, body, caller, [prompt], body.max_output_tokens, None, "resp", structured), trace, caller)
    builder = ResponseBuilder(body, int(time.time()), body.text_format)
    tools = ToolOutput(plan, state.config.tool_call_parser) if plan and plan.choice != "none" else None
    if body.stream:
        return JobStream(job, _stream(state, job, builder, conversation, tools, caller.tenant.name),
                         media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        outputs = await gather_outputs(state, job, request)
    finally:
        job.release()
    if job.trace is not None:
        job.trace.finish(outputs or [], cancelled=outputs is None)
    if outputs is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    items = _output_items(outputs[0], new_id("msg"), tools)
    return JSONResponse(_finish(state, builder, job, outputs[0], items, conversation, caller.tenant.name))


def _output_items(output: RequestOutput, item_id: str, tools: ToolOutput | None) -> list[dict]:
    """A message item (if there is text), then a function_call item per call."""
    content, calls = tools.final(output.text, output.finish_reason) if tools else (output.text, [])
    items = [message_item(item_id, content)] if content is not None and (content or not calls) else []
    return items + [function_call_item(new_id("fc"), call["id"], call["function"]["name"],
                                       call["function"]["arguments"]) for call in calls]


def _finish(state: ServerState, builder: ResponseBuilder, job: Job, output: RequestOutput, items: list[dict],
            conversation: list[dict], owner: str) -> dict:
    """The final response object (stored when asked)."""
    reason = INCOMPLETE_REASONS.get(output.finish_reason)
    usage = response_usage(job.num_prompt_tokens, len(output.token_ids), output.num_cached_tokens)
    response = builder.response("incomplete" if reason else "completed", items, usage, reason)
    if builder.body.store:
        text = "".join(item["content"][0]["text"] for item in items if item["type"] == "message")
        reply = {"role": "assistant", "content": text}
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in items if item["type"] == "function_call"]
        state.responses.put(builder.id, StoredResponse(response, conversation + [reply | (
            {"tool_calls": calls} if calls else {})], owner))
    return response


async def _stream(state: ServerState, job: Job, builder: ResponseBuilder, conversation: list[dict],
                  tools: ToolOutput | None, owner: str):
    """Text streams as it comes; with tools the output is sent whole at the end, as its items (a call's arguments
    are one delta)."""
    [(_, sub_id, prompt, params)] = list(job.sub_requests())
    item_id, emitted = new_id("msg"), 0
    kept: list[RequestOutput | None] = [None]   # the latest output, for the request's trace
    ended = False
    if job.trace is not None:
        job.trace.outputs = kept
    try:
        for event in builder.started() + ([] if tools else builder.text_started(0, item_id)):
            yield event
        last = None
        async for output in job.outputs(state.engine, sub_id, prompt, params):
            last, emitted = output, len(output.token_ids)
            kept[0] = output
            if output.new_text and tools is None:
                yield builder.text_delta(0, item_id, output.new_text)
        items = _output_items(last, item_id, tools)
        for index, item in enumerate(items):
            if item["type"] == "function_call":
                events = [builder.call_started(index, item)] + builder.call_done(index, item)
            elif tools is None:
                events = builder.text_done(index, item_id, last.text)
            else:
                text = item["content"][0]["text"]
                events = (builder.text_started(index, item_id) + [builder.text_delta(index, item_id, text)]
                          + builder.text_done(index, item_id, text))
            for event in events:
                yield event
        finished = builder.finished(_finish(state, builder, job, last, items, conversation, owner))
        ended = True
        if job.trace is not None:   # before the last event: once a client (a router) has it, the span has ended
            job.trace.finish()
        yield finished
    except Exception as error:   # noqa: BLE001 - reported to the client as an error event
        if job.trace is not None:
            job.trace.fail(error)
        if isinstance(error, APIError):   # a finished answer that broke its schema (checked_answers)
            state.metrics.count_error(error.status)
            yield builder.event("error", code=error.code, message=error.message, param=error.param)
        else:
            state.metrics.count_error(500)
            yield builder.event("error", code="server_error", message=str(error), param=None)
    finally:
        state.keys.charge(job.key, emitted)
        if job.trace is not None:
            job.trace.finish(cancelled=not ended)


def get_response(state: ServerState, response_id: str, request: Request) -> dict:
    caller = authenticate(state, request)
    stored = state.responses.get(response_id, caller.tenant.name)
    if stored is None:
        raise APIError(404, f"response {response_id!r} is not stored on this replica", "response_id", "not_found")
    return stored.body


def delete_response(state: ServerState, response_id: str, request: Request) -> dict:
    caller = authenticate(state, request)
    if not state.responses.delete(response_id, caller.tenant.name):
        raise APIError(404, f"response {response_id!r} is not stored on this replica", "response_id", "not_found")
    return {"id": response_id, "object": "response", "deleted": True}
