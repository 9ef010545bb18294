"""How a constrained answer may lay its JSON out: the whitespace a model was trained to write, bounded.

Between any two JSON tokens the grammar allows nothing, one space, or one newline followed by up to
INDENT * levels spaces or tabs, where `levels` is the schema's nesting depth plus one (MAX_LEVELS where the depth is
open: recursive or free-form values). So a model writes `{\\n  "city": "Paris",\\n  ...\\n}` the way it learned,
and can neither be forced off it (a compact-only grammar forbids the newline after the last value, and a small
model then writes digits forever) nor ramble in whitespace (each run is bounded, and there is one per token gap).
Measured on SmolLM2-135M-Instruct: docs/server.md, "Structured output".
"""
INDENT = 4
MAX_LEVELS = 8

NESTED = ("properties", "patternProperties")
IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")


def layout_options(schema: dict) -> dict:
    """llguidance's JSON options for `schema` (the grammar's schema, after `enforceable`)."""
    levels = min(nesting(schema, schema) + 1, MAX_LEVELS)
    return {"whitespace_pattern": rf"(\n[ \t]{{0,{INDENT * levels}}}| )?"}


def nesting(schema, root: dict) -> int:
    """How many objects and arrays deep a value of `schema` can go (MAX_LEVELS: as deep as it likes)."""
    return _Depth(root).of(schema)


class _Depth:
    """Depths of one document's subschemas, each `$ref` target measured once (a cycle is as deep as it likes)."""

    def __init__(self, root: dict):
        self.root, self.known, self.open = root, {}, set()

    def of(self, schema) -> int:
        if not isinstance(schema, dict):
            return 0 if schema is False else MAX_LEVELS   # `true` or an absent schema: any JSON value
        depth = self._ref(schema["$ref"]) if isinstance(schema.get("$ref"), str) else 0
        for key in IN_PLACE_LISTS:
            for sub in schema.get(key) or ():
                depth = max(depth, self.of(sub))
        if depth < MAX_LEVELS and _may_be(schema, "object"):
            children = [sub for key in NESTED for sub in (schema.get(key) or {}).values()]
            children.append(schema.get("additionalProperties", schema.get("unevaluatedProperties", True)))
            depth = max(depth, 1 + max(map(self.of, children)))
        if depth < MAX_LEVELS and _may_be(schema, "array"):
            children = list(schema.get("prefixItems") or ())
            children.append(schema.get("items", schema.get("unevaluatedItems", True)))
            depth = max(depth, 1 + max(map(self.of, children)))
        return min(depth, MAX_LEVELS)

    def _ref(self, ref: str) -> int:
        if ref not in self.known:
            if ref in self.open or not ref.startswith("#"):
                return MAX_LEVELS
            self.open.add(ref)
            self.known[ref] = self.of(_resolve(self.root, ref))
            self.open.discard(ref)
        return self.known[ref]


def _may_be(schema: dict, kind: str) -> bool:
    """Whether a value of `schema` may be a JSON `kind` (no type, or a type naming it; a const or enum decides)."""
    if "const" in schema or "enum" in schema:
        return False   # a fixed value: laid out compact by the grammar anyway
    types = schema.get("type")
    if types is None:
        return not any(key in schema for key in IN_PLACE_LISTS + ("$ref",))
    return kind in ([types] if isinstance(types, str) else types)


def _resolve(root: dict, ref: str):
    """A local JSON pointer's target ("#" is the root); None for an anchor or a pointer to nothing."""
    if ref != "#" and not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node
