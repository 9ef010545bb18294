"""A renderer for the subset of Helm template syntax that charts/kubeinfer uses (there is no Helm binary here).

Supported: ``{{ pipeline }}`` with ``{{-``/``-}}`` trimming, ``{{/* comments */}}``, ``if``/``else``/``end``,
``range`` (``.`` is the item, ``$`` the root), field paths (``.Values.a.b``, ``$.Release.Name``), string
and raw-string literals, and the functions ``quote``, ``toYaml``, ``indent``, ``nindent``, ``join``, ``eq``,
``not`` and ``.Files.Get``. Anything else raises, so a template that uses more than this fails the test
instead of rendering wrongly. Truthiness follows Go templates: false, 0, "", empty maps/lists and nil are false.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_ACTION = re.compile(r"\{\{(-\s)?\s*((?:`[^`]*`|\"(?:[^\"\\]|\\.)*\"|[^`\"}]|\}(?!\}))*?)\s*(\s-)?\}\}", re.S)
_TOKEN = re.compile(r"`[^`]*`|\"(?:[^\"\\]|\\.)*\"|\(|\)|[^\s()]+")


class TemplateError(Exception):
    pass


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False).rstrip("\n")


def _go_str(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        raise TemplateError(f"printing a map/list directly ({value!r}); use toYaml")
    return str(value)


class Renderer:
    def __init__(self, chart_dir: Path, values: dict[str, Any], release: str, namespace: str) -> None:
        chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
        self.chart_dir = chart_dir
        self.root = {"Values": values, "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
                     "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]}}

    # ------------------------------------------------------------------ parsing
    def _tokens(self, text: str) -> list[tuple[str, str]]:
        """[("text", s) | ("action", body)] with trim markers applied to the neighbouring text."""
        out: list[tuple[str, str]] = []
        pos = 0
        for match in _ACTION.finditer(text):
            chunk = text[pos:match.start()]
            if match.group(1):
                chunk = chunk.rstrip()
            out.append(("text", chunk))
            out.append(("action", match.group(2).strip(), bool(match.group(3))))  # type: ignore[arg-type]
            pos = match.end()
        out.append(("text", text[pos:]))
        # Right trim: strip leading whitespace of the text after an action ending in " -}}".
        fixed: list[tuple[str, str]] = []
        trim_next = False
        for token in out:
            if token[0] == "text":
                fixed.append(("text", token[1].lstrip() if trim_next else token[1]))
                trim_next = False
            else:
                fixed.append(("action", token[1]))
                trim_next = token[2]  # type: ignore[misc]
        return fixed

    def _tree(self, tokens: list[tuple[str, str]]) -> list[Any]:
        stack: list[list[Any]] = [[]]
        frames: list[dict[str, Any]] = []
        for kind, body in tokens:
            if kind == "text":
                stack[-1].append(("text", body))
            elif body.startswith("/*"):
                continue
            elif body.startswith(("if ", "range ")):
                word, _, expr = body.partition(" ")
                frame = {"kind": word, "expr": expr, "then": [], "else": []}
                stack[-1].append(("block", frame))
                frames.append(frame)
                stack.append(frame["then"])
            elif body == "else":
                stack.pop()
                stack.append(frames[-1]["else"])
            elif body == "end":
                stack.pop()
                frames.pop()
            elif body.split(" ")[0] in ("with", "define", "template", "include", "block", "else if"):
                raise TemplateError(f"unsupported action {body!r}")
            else:
                stack[-1].append(("expr", body))
        if frames:
            raise TemplateError("unclosed block")
        return stack[0]

    # --------------------------------------------------------------- evaluation
    def _value(self, token: str, dot: Any) -> Any:
        if token.startswith('"'):
            return bytes(token[1:-1], "utf-8").decode("unicode_escape")
        if token.startswith("`"):
            return token[1:-1]
        if re.fullmatch(r"-?\d+", token):
            return int(token)
        if token in ("true", "false"):
            return token == "true"
        if token == ".":
            return dot
        if token.startswith("$"):
            base, path = self.root, token[1:]
        elif token.startswith("."):
            base, path = (dot if dot is not self.root else self.root), token
        else:
            raise TemplateError(f"unknown token {token!r}")
        for part in [p for p in path.split(".") if p]:
            if not isinstance(base, dict):
                raise TemplateError(f"{token}: not a map at {part!r}")
            base = base.get(part)
        return base

    def _call(self, words: list[str], dot: Any, piped: list[Any]) -> Any:
        name, args = words[0], [self._value(w, dot) for w in words[1:]] + piped
        if name == ".Files.Get":
            return (self.chart_dir / args[0]).read_text()
        functions = {
            "quote": lambda v: '"' + _go_str(v).replace("\\", "\\\\").replace('"', '\\"') + '"',
            "toYaml": _to_yaml,
            "indent": lambda n, s: " " * n + s.replace("\n", "\n" + " " * n),
            "nindent": lambda n, s: "\n" + " " * n + s.replace("\n", "\n" + " " * n),
            "join": lambda sep, items: sep.join(_go_str(i) for i in (items or [])),
            "eq": lambda a, b: a == b,
            "not": lambda v: not _truthy(v),
        }
        if name in functions:
            return functions[name](*args)
        if len(words) == 1 and not piped:
            return self._value(name, dot)
        raise TemplateError(f"unsupported function {name!r}")

    def _pipeline(self, expr: str, dot: Any) -> Any:
        stages = [s.strip() for s in re.split(r"\|(?=(?:[^\"`]*[\"`][^\"`]*[\"`])*[^\"`]*$)", expr)]
        result: list[Any] = []
        for stage in stages:
            words = _TOKEN.findall(stage)
            if "(" in words:
                raise TemplateError(f"parentheses are not supported: {expr!r}")
            result = [self._call(words, dot, result)]
        return result[0]

    def _render(self, nodes: list[Any], dot: Any) -> str:
        out = []
        for kind, node in nodes:
            if kind == "text":
                out.append(node)
            elif kind == "expr":
                out.append(_go_str(self._pipeline(node, dot)))
            elif node["kind"] == "if":
                branch = node["then"] if _truthy(self._pipeline(node["expr"], dot)) else node["else"]
                out.append(self._render(branch, dot))
            else:  # range
                items = self._pipeline(node["expr"], dot) or []
                out.append("".join(self._render(node["then"], item) for item in items) if items
                           else self._render(node["else"], dot))
        return "".join(out)

    def render_text(self, text: str) -> str:
        return self._render(self._tree(self._tokens(text)), self.root)

    def render_chart(self) -> dict[str, str]:
        """Template file name -> rendered text (NOTES.txt and partials excluded, as `helm template`)."""
        return {path.name: self.render_text(path.read_text())
                for path in sorted((self.chart_dir / "templates").glob("*.yaml"))}

    def objects(self) -> list[dict[str, Any]]:
        objs: list[dict[str, Any]] = []
        for name, text in self.render_chart().items():
            try:
                docs = list(yaml.safe_load_all(text))
            except yaml.YAMLError as error:
                raise TemplateError(f"{name} renders to invalid YAML: {error}\n{text}") from error
            objs.extend(doc for doc in docs if doc)
        return objs
