"""Tool calls in a model's free text (`tool_choice: auto`), in the format the served model was trained on, chosen
with `kubeinfer serve --tool-call-parser`:

- `hermes` (Hermes, Qwen 2/2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, the text
  before the first one being the message's content;
- `llama3_json` (Llama 3.1/3.2/3.3): the whole output is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`), several separated by `;`.

Text that does not parse as calls is content, unchanged. `hold_point` says from where a stream must hold its text
back because it may be the start of a call.
"""
import json
import re

from kubeinfer.runtime.server.tools import new_call

from kubeinfer.runtime.config import TOOL_CALL_PARSERS   # noqa: F401 - the names, checked there
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_HERMES = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(HERMES_CLOSE) + r"|$)", re.DOTALL)


def parse_tool_calls(parser: str, text: str) -> tuple[str | None, list[dict]]:
    """(content, calls) of a finished output; calls are empty when there are none."""
    if parser == "hermes":
        return _hermes(text)
    return _llama3_json(text)


def hold_point(parser: str, text: str) -> int | None:
    """Where, in a stream's output so far, a call starts or may start (the text from there is held back); None
    when none can."""
    if parser == "hermes":
        start = text.find(HERMES_OPEN)
        if start >= 0:
            return start
        partial = [n for n in range(1, len(HERMES_OPEN)) if text.endswith(HERMES_OPEN[:n])]
        return len(text) - max(partial) if partial else None
    stripped = text.lstrip()
    if not stripped or stripped.startswith("{") or PYTHON_TAG.startswith(stripped[:len(PYTHON_TAG)]):
        return 0
    return None


def _hermes(text: str) -> tuple[str | None, list[dict]]:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls = []
    for match in _HERMES.finditer(text, start):
        call = _call(match.group(1), "arguments")
        if call is None:
            return text, []
        calls.append(call)
    return (text[:start] if text[:start].strip() else None), calls   # as streamed: not stripped


def _llama3_json(text: str) -> tuple[str | None, list[dict]]:
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    decoder = json.JSONDecoder()
    position = 0
    while position < len(body):
        try:
            value, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return text, []
        call = _call(value, "parameters")
        if call is None:
            return text, []
        calls.append(call)
        position = end
        while position < len(body) and body[position] in "; \n\t":
            position += 1
    return None, calls


def _call(value, arguments_key: str) -> dict | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if not isinstance(arguments, dict):
        return None
    return new_call(value["name"], json.dumps(arguments, ensure_ascii=False))
