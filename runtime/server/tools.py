"""Tool calls: the request's `tools` and `tool_choice`, checked, and what they mean for generation.

- `none`: the tools are not offered (the template is rendered without them); plain text.
- `auto` (the default with tools): the template is rendered with the tools; the model's text is parsed for calls by
  the `--tool-call-parser` (`tool_parsers`); text without a call is the answer.
- `required`: the output is constrained by a grammar to a JSON list of calls `[{"name", "arguments"}]`, each
  call's arguments valid for its function's `parameters` schema (one call at most with `parallel_tool_calls: false`).
- a named function: the output is constrained to that function's arguments.

Chat takes tools as `{"type": "function", "function": {"name", "description", "parameters"}}` and names a function
as `{"type": "function", "function": {"name"}}`; the Responses API flattens both (`{"type": "function", "name", ...}`).
"""
import json
import uuid
from dataclasses import dataclass

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.structured.schema_check import json_schema_output
from kubeinfer.runtime.structured.spec import StructuredOutput

CHOICES = ("none", "auto", "required")


@dataclass
class Tool:
    name: str
    description: str | None
    parameters: dict

    def template_entry(self) -> dict:
        """As chat templates take tools (Hugging Face's convention)."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass
class ToolPlan:
    tools: list[Tool]
    choice: str               # none, auto, required, or "function" (then `name`)
    name: str | None = None
    parallel: bool = True

    @property
    def offered(self) -> list[dict] | None:
        """The tools as the template renders them (none when the choice is none)."""
        return [tool.template_entry() for tool in self.tools] if self.tools and self.choice != "none" else None

    def structured_output(self, layout: str = "model") -> StructuredOutput | None:
        if self.choice == "function":
            tool = next(t for t in self.tools if t.name == self.name)
            return json_schema_output(tool.parameters, "tools.parameters", "tool_calls", layout)
        if self.choice != "required":
            return None
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                  "properties": {"name": {"const": tool.name}, "arguments": tool.parameters}} for tool in self.tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return json_schema_output(schema, "tools", "tool_calls", layout)

    def constrained_calls(self, text: str) -> list[dict]:
        """The calls of a constrained output (`required` or a named function)."""
        if self.choice == "function":
            return [new_call(self.name, text)]
        return [new_call(call["name"], json.dumps(call["arguments"], ensure_ascii=False, separators=(",", ":")))
                for call in json.loads(text)]


def new_call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def plan_tools(tools: list[dict] | None, tool_choice, parallel: bool | None, flat: bool) -> ToolPlan | None:
    """Checks `tools` and `tool_choice` (400s naming the param); None when the request has no tools. `flat`: the
    Responses API's shapes."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools", "tool_choice")
        return None
    checked = [_tool(entry, index, flat) for index, entry in enumerate(tools)]
    names = [tool.name for tool in checked]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools must have distinct names", "tools")
    plan = ToolPlan(checked, "auto", parallel=parallel is not False)
    if tool_choice is None or tool_choice in CHOICES:
        plan.choice = tool_choice or "auto"
        return plan
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = tool_choice.get("name") if flat else (tool_choice.get("function") or {}).get("name")
        if name not in names:
            raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        plan.choice, plan.name = "function", name
        return plan
    raise InvalidRequestError("tool_choice must be none, auto, required or a function", "tool_choice")


def _tool(entry, index: int, flat: bool) -> Tool:
    param = f"tools[{index}]"
    if not isinstance(entry, dict) or entry.get("type") != "function":
        kind = entry.get("type") if isinstance(entry, dict) else None
        raise InvalidRequestError(f"{param}: tools of type {kind!r} are not supported; only functions", param)
    function = entry if flat else entry.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise InvalidRequestError(f"{param}: a function needs a name", param)
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    where = f"{param}.parameters" if flat else f"{param}.function.parameters"
    json_schema_output(parameters, where)   # checked now: a bad schema is refused even under auto
    return Tool(function["name"], function.get("description"), parameters)
