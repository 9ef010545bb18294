"""The schema the grammar enforces for a request's JSON schema: the user's schema where the grammar library enforces
it exactly, a sound over-approximation where a keyword cannot be enforced token by token, and bounds on numbers.

Sound means every answer valid for the user's schema stays possible; what the grammar lets through beyond it is
caught when the answer is finished (`answer_check`, against the user's own schema), so no answer that does not
validate is returned. docs/server.md has the table, keyword by keyword.

    not, if/then/else, uniqueItems, propertyNames, dependentRequired, dependentSchemas   dropped, checked after
    contains, minContains, maxContains        dropped, checked after; minItems raised to the count contains needs
    unevaluatedProperties / unevaluatedItems  exactly additionalProperties / items where the schema has no in-place
                                              applicator (allOf, anyOf, oneOf, $ref, if, not, dependentSchemas);
                                              else dropped, checked after
    format the library does not know         dropped (an annotation in draft 2020-12, as the spec says)
    a number without multipleOf              at most FRACTION_DIGITS digits after the point
    a number without minimum / maximum       below 10**INTEGER_DIGITS in magnitude
    a free-form value ({}, true, the members of an object or array nothing describes)
                                              the same two bounds if it is a number (not inside it: the grammar
                                              would outgrow the library's limit on large schemas)
    an object with properties and nothing said of others      no others (additionalProperties false)

A small model left to write a number without bounds can write digits forever (`11.19888888...`; in a free-form
value `"id": 1234567890123...`), and one left to add properties a schema does not name invents them until
max_tokens (measured on SmolLM2-135M-Instruct with pydantic's schemas, which leave additionalProperties open: 14 of
26 greedy answers cut; docs/server.md). No schema range needs more digits than these, a property the schema does not
name is never required, and composed objects (allOf with more than one branch, dependentSchemas, if) are left open:
an answer the bounds shape is still valid for the user's schema.
"""
import copy

FRACTION_DIGITS = 6
INTEGER_DIGITS = 15
GRAMMAR_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
                             "uuid"})   # the formats llguidance enforces (measured on 1.9.1); others are annotations
CHECKED_AFTER = ("not", "if", "then", "else", "uniqueItems", "propertyNames", "dependentRequired",
                 "dependentSchemas", "dependencies", "contains", "minContains", "maxContains")
OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
IN_PLACE = ("allOf", "anyOf", "oneOf", "$ref", "if", "not", "dependentSchemas", "dependencies")

SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies")
DEFINITIONS = ("$defs", "definitions")   # maps of schemas, or of groups of them ("#/$defs/plugins/extractors")
SCHEMA_VALUES = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
                 "unevaluatedItems", "unevaluatedProperties", "additionalItems")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
VALIDATION = frozenset(CHECKED_AFTER + IN_PLACE + SCHEMA_MAPS + SCHEMA_VALUES + SCHEMA_LISTS + (
    "type", "enum", "const", "required", "format", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "minItems", "maxItems", "minProperties",
    "maxProperties", "$dynamicRef", "$recursiveRef", "discriminator"))
KEYWORDS = VALIDATION | frozenset(DEFINITIONS + ("title", "description", "default", "examples", "$id", "$schema",
                                                 "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$comment"))


class Unsatisfiable(ValueError):
    """No JSON value satisfies the schema (`false`, `{"not": {}}`): no grammar can be built for it."""


def enforceable(schema) -> tuple[dict, tuple[str, ...]]:
    """The schema for the grammar and the keywords it only approximates (sorted; empty when the grammar is exact)."""
    if schema is False or _excludes_all(schema):
        raise Unsatisfiable("no JSON value satisfies it (its root is false or excludes everything with not)")
    approximated: set[str] = set()
    result = _rewrite(copy.deepcopy({} if schema is True else schema), approximated, not _composes_objects(schema))
    return result, tuple(sorted(approximated))


def _composes_objects(schema) -> bool:
    """Whether some object's properties may come from more than one subschema (closing either would be wrong)."""
    if isinstance(schema, list):
        return any(_composes_objects(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    if len(schema.get("allOf") or ()) > 1 or any(key in schema for key in ("dependentSchemas", "dependencies", "if")):
        return True
    return any(_composes_objects(value) for key, value in schema.items() if key not in ("enum", "const"))


def _excludes_all(schema) -> bool:
    return isinstance(schema, dict) and schema.get("not") in ({}, True)


def free_value() -> dict:
    """Any JSON value, bounded as a schema's number is if it is a number (numeric keywords constrain numbers only).
    Not the numbers inside its objects and arrays: that nesting, a few levels deep at each free-form value, made the
    grammars of the openai SDK's largest schemas too big for the library (4 of the 152 of the corpus's sample)."""
    limit = 10 ** INTEGER_DIGITS - 1
    return {"minimum": -limit, "maximum": limit, "multipleOf": 10.0 ** -FRACTION_DIGITS}


def _rewrite(schema, approximated: set[str], close: bool):
    if schema is True:
        return free_value()
    if not isinstance(schema, dict):
        return schema
    if _excludes_all(schema):   # below the root: the value cannot appear at all, which `false` says exactly
        return False
    if not schema.keys() & (VALIDATION | set(DEFINITIONS)):   # annotations at most: any value
        return {**schema, **free_value()}
    closable = close and "properties" in schema and not any(key in schema for key in OPEN_KEYS + IN_PLACE)
    if "$ref" in schema:   # annotations beside a $ref (markdownDescription, ...) are siblings to the library
        for key in [key for key in schema if key not in VALIDATION and key not in DEFINITIONS and key[0] != "$"]:
            del schema[key]
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            schema[key] = {name: _rewrite(sub, approximated, close) for name, sub in schema[key].items()}
    for key in DEFINITIONS:
        if isinstance(schema.get(key), dict):
            schema[key] = _definitions(schema[key], approximated, close)
    for key in SCHEMA_VALUES:
        if isinstance(schema.get(key), dict) or schema.get(key) is True:
            schema[key] = _rewrite(schema[key], approximated, close)
    for key in SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            schema[key] = [_rewrite(sub, approximated, close) for sub in schema[key]]
    _free_members(schema)
    _unevaluated(schema, approximated)
    _contains(schema)
    for key in CHECKED_AFTER:
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            approximated.add(key)
        schema.pop(key, None)
    if "format" in schema and schema["format"] not in GRAMMAR_FORMATS:
        del schema["format"]
    _bound_numbers(schema)
    if closable:
        schema["additionalProperties"] = False
    if schema.get("additionalProperties", True) is not False or "patternProperties" in schema:
        for key in ("minProperties", "maxProperties"):   # counted by the library only over listed properties
            if key in schema:
                approximated.add(key)
                del schema[key]
    return schema


def _definitions(group: dict, approximated: set[str], close: bool) -> dict:
    """A definitions map: each entry a schema, or (no schema keyword in it, every value an object) a nested group."""
    def is_group(entry) -> bool:
        return (isinstance(entry, dict) and bool(entry) and not KEYWORDS & entry.keys()
                and all(isinstance(value, dict) for value in entry.values()))
    return {name: _definitions(entry, approximated, close) if is_group(entry) else _rewrite(entry, approximated, close)
            for name, entry in group.items()}


def _unevaluated(schema: dict, approximated: set[str]) -> None:
    in_place = any(key in schema for key in IN_PLACE)
    for unevaluated, plain in (("unevaluatedProperties", "additionalProperties"), ("unevaluatedItems", "items")):
        if unevaluated not in schema:
            continue
        value = schema.pop(unevaluated)
        if in_place or plain in schema:
            approximated.add(unevaluated)
        else:   # nothing else evaluates the instance's members here: the two keywords mean the same
            schema[plain] = value


def _contains(schema: dict) -> None:
    """`contains` needs at least minContains (default 1) items: enforced as minItems (the rest is checked after)."""
    if "contains" not in schema:
        return
    needed = schema.get("minContains", 1)
    if isinstance(needed, int) and needed > schema.get("minItems", 0):
        schema["minItems"] = needed


def _free_members(schema: dict) -> None:
    """An object or array type whose members nothing describes (no properties, items, in-place applicator): its
    members are free-form values."""
    if any(key in schema for key in IN_PLACE + ("enum", "const")):
        return
    types = schema.get("type")
    types = {types} if isinstance(types, str) else set(types or ())
    if "object" in types and not any(key in schema for key in ("properties",) + OPEN_KEYS):
        schema["additionalProperties"] = free_value()
    if "array" in types and not any(key in schema for key in ("items", "prefixItems", "unevaluatedItems")):
        schema["items"] = free_value()


def _bound_numbers(schema: dict) -> None:
    types = schema.get("type")
    types = {types} if isinstance(types, str) else set(types or ())
    if not types & {"number", "integer"} or "enum" in schema or "const" in schema:
        return
    if "number" in types and "multipleOf" not in schema:
        schema["multipleOf"] = 10.0 ** -FRACTION_DIGITS
    limit = 10 ** INTEGER_DIGITS - 1
    if "minimum" not in schema and "exclusiveMinimum" not in schema:
        schema["minimum"] = -limit
    if "maximum" not in schema and "exclusiveMaximum" not in schema:
        schema["maximum"] = limit
