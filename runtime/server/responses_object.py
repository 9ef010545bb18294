"""The Responses API's response object and its stream of semantic events.

A stream goes, each event with the next `sequence_number` from 0:
`response.created`, `response.in_progress`, then per output item `response.output_item.added` and, for a message,
`response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done` (for a function call, `response.function_call_arguments.delta`... and `.done`), then
`response.output_item.done`; last `response.completed` (or `response.incomplete` when max_output_tokens cut it).
"""
import json
import uuid
from typing import Any

from kubeinfer.runtime.server.responses_protocol import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_text_part(text)] if status == "completed" else []}


def output_text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


class ResponseBuilder:
    def __init__(self, body: ResponsesRequest, created_at: int, text_format: dict):
        self.id = new_id("resp")
        self.body, self.created_at, self.text_format = body, created_at, text_format
        self.sequence_number = 0

    def response(self, status: str, output: list[dict] | None = None, usage: dict | None = None,
                 incomplete_reason: str | None = None) -> dict:
        body = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": self.created_at if status == "completed" else None,
            "model": body.model, "output": output or [], "error": None,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "store": body.store,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p, "text": {"format": self.text_format},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "truncation": "disabled",
            "usage": usage, "user": body.user, "background": False, "reasoning": None,
        }

    # -- stream events -------------------------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def started(self) -> list[str]:
        return [self.event("response.created", response=self.response("in_progress")),
                self.event("response.in_progress", response=self.response("in_progress"))]

    def text_started(self, index: int, item_id: str) -> list[str]:
        return [self.event("response.output_item.added", output_index=index,
                           item=message_item(item_id, "", "in_progress")),
                self.event("response.content_part.added", output_index=index, item_id=item_id, content_index=0,
                           part=output_text_part(""))]

    def text_delta(self, index: int, item_id: str, delta: str) -> str:
        return self.event("response.output_text.delta", output_index=index, item_id=item_id, content_index=0,
                          delta=delta, logprobs=[])

    def text_done(self, index: int, item_id: str, text: str) -> list[str]:
        return [self.event("response.output_text.done", output_index=index, item_id=item_id, content_index=0,
                           text=text, logprobs=[]),
                self.event("response.content_part.done", output_index=index, item_id=item_id, content_index=0,
                           part=output_text_part(text)),
                self.event("response.output_item.done", output_index=index, item=message_item(item_id, text))]

    def call_started(self, index: int, item: dict) -> str:
        return self.event("response.output_item.added", output_index=index, item=dict(item, arguments="",
                                                                                        status="in_progress"))

    def call_done(self, index: int, item: dict) -> list[str]:
        return [self.event("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                           delta=item["arguments"]),
                self.event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                           name=item["name"], arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def finished(self, response: dict) -> str:
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return self.event(kind, response=response)
