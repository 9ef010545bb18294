"""A response's tool calls, whole or streamed: constrained outputs (`required`, a named function) are calls by
construction; `auto` outputs are parsed (`tool_parsers`). A stream sends text as it comes until it may be the start
of a call, then holds it back: at the end the held text goes out as calls, or as content if it was none."""
from dataclasses import dataclass, field

from kubeinfer.runtime.server.tool_parsers import hold_point, parse_tool_calls
from kubeinfer.runtime.server.tools import ToolPlan


@dataclass
class ToolOutput:
    plan: ToolPlan
    parser: str
    _sent: dict[int, int] = field(default_factory=dict)   # characters of content streamed, per choice

    @property
    def constrained(self) -> bool:
        return self.plan.choice in ("required", "function")

    def final(self, text: str, finish_reason: str | None) -> tuple[str | None, list[dict]]:
        """(content, calls) of a finished output. A constrained output cut by max_tokens is no call: its text is
        returned as content."""
        if self.constrained:
            return (None, self.plan.constrained_calls(text)) if finish_reason == "stop" else (text, [])
        return parse_tool_calls(self.parser, text)

    def step(self, index: int, text: str, finished: bool, finish_reason: str | None) -> tuple[str, list[dict]]:
        """(content delta, calls) to stream now for choice `index`, whose text so far is `text`."""
        sent = self._sent.get(index, 0)
        if finished:
            content, calls = self.final(text, finish_reason)
            if calls:
                return (content or "")[sent:], calls
            return text[sent:], []
        cut = 0 if self.constrained else hold_point(self.parser, text)
        end = len(text) if cut is None else max(cut, sent)
        self._sent[index] = end
        return text[sent:end], []
