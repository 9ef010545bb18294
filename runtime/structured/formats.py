"""Requests' output formats as grammars: `response_format` (chat and completions) and `text.format` (responses).

    {"type": "text"}                                        no constraint
    {"type": "json_object"}                                 any JSON object
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}     (chat, completions)
    {"type": "json_schema", "name", "schema", "strict"}                       (responses' text.format)

`strict` true or not, the schema is enforced (a grammar constrains every token, `schema_check`) and the finished
answer is validated against it (`answer_check`); the JSON's layout is the model's own, bounded (`json_layout`).
"""
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.structured.schema_check import json_schema_output
from kubeinfer.runtime.structured.spec import StructuredOutput

FORMAT_TYPES = ("text", "json_object", "json_schema")


def response_format_output(response_format: dict | None, param: str = "response_format",
                           layout: str = "model") -> StructuredOutput | None:
    """Chat and completions' `response_format`."""
    if response_format is None:
        return None
    kind = _format_type(response_format, param)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidRequestError(f"{param}.json_schema is required with type json_schema", f"{param}.json_schema")
        return _schema_output(spec, f"{param}.json_schema", layout)
    return _simple_output(kind, param, layout)


def text_format_output(text_format: dict | None, param: str = "text.format",
                       layout: str = "model") -> StructuredOutput | None:
    """The Responses API's `text.format`: the json_schema fields sit beside the type."""
    if text_format is None:
        return None
    kind = _format_type(text_format, param)
    if kind == "json_schema":
        return _schema_output(text_format, param, layout)
    return _simple_output(kind, param, layout)


def _format_type(fmt, param: str) -> str:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in FORMAT_TYPES:
        raise InvalidRequestError(f"{param}.type must be one of {', '.join(FORMAT_TYPES)}, got {kind!r}", f"{param}.type")
    return kind


def _simple_output(kind: str, param: str, layout: str) -> StructuredOutput | None:
    if kind == "text":
        return None
    return json_schema_output({"type": "object"}, param, "json_object", layout)


def _schema_output(spec: dict, param: str, layout: str) -> StructuredOutput:
    if "schema" not in spec:
        raise InvalidRequestError(f"{param}.schema is required", f"{param}.schema")
    if not isinstance(spec.get("name", ""), str):
        raise InvalidRequestError(f"{param}.name must be a string", f"{param}.name")
    return json_schema_output(spec["schema"], f"{param}.schema", layout=layout)
