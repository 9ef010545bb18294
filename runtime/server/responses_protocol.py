"""The body of `POST /v1/responses` as we accept it (pydantic), and its input items as chat messages.

Input: a string (one user message) or a list of items: messages (`role` and `content`, a string or parts of type
`input_text`/`output_text`), and, for tools, `function_call` and `function_call_output` items. Anything else
(images, files, reasoning items) is refused with 400, naming the item.
"""
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.server.protocol import _SamplingFields
from kubeinfer.runtime.structured.formats import text_format_output
from kubeinfer.runtime.structured.spec import StructuredOutput

TEXT_PART_TYPES = ("input_text", "output_text", "text")
MESSAGE_ROLES = ("system", "developer", "user", "assistant")


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: dict[str, Any] | None = None


class ResponsesRequest(_SamplingFields):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    n: Literal[1] = 1
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    top_logprobs: int | None = None
    background: bool = False
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None

    def check_unsupported(self) -> None:
        """Fields this server cannot honour are refused, never ignored."""
        if self.background:
            raise InvalidRequestError("background responses are not supported", "background")
        if self.reasoning and any(value is not None for value in self.reasoning.values()):
            raise InvalidRequestError("reasoning settings are not supported: this server serves no reasoning "
                                      "models", "reasoning")
        if self.include:
            raise InvalidRequestError(f"include is not supported (asked: {', '.join(self.include)})", "include")
        if self.top_logprobs:
            raise InvalidRequestError("top_logprobs is not supported on /v1/responses", "top_logprobs")
        if self.truncation == "auto":
            raise InvalidRequestError("truncation 'auto' is not supported: a prompt too long is refused", "truncation")

    def structured_output(self, layout: str = "model") -> StructuredOutput | None:
        return text_format_output(self.text.format if self.text else None, layout=layout)

    @property
    def text_format(self) -> dict:
        return (self.text.format if self.text else None) or {"type": "text"}

    def input_items(self) -> list[dict[str, Any]]:
        """The input as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        if not self.input:
            raise InvalidRequestError("input is empty", "input")
        return self.input


def item_messages(items: list[dict[str, Any]], param: str = "input") -> list[dict[str, Any]]:
    """Chat messages (as the chat template takes them) for a list of input or output items."""
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"{param}[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise InvalidRequestError(f"{where}: role must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}",
                                          param)
            messages.append({"role": role, "content": _content_text(item.get("content"), where, param)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _content_text(output, where, param)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        else:
            raise InvalidRequestError(f"{where}: items of type {kind!r} are not supported; this server takes "
                                      "messages, function_call and function_call_output items", param)
    return messages


def _content_text(content, where: str, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: content must be a string or a list of parts", param)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PART_TYPES or not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{where}: a content part of type {kind!r} is not supported; this server "
                                      "takes text only (input_text, output_text)", param)
        texts.append(part["text"])
    return "".join(texts)
