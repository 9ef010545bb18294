"""Checks a request's JSON schema before anything is generated and builds its grammar: a schema that is not valid
JSON Schema is a 400 naming the field (its path in the schema); one no value satisfies is a 400 saying so; a keyword
neither the grammar library enforces nor `enforceable` approximates is a 400 naming the keyword. Nothing is
silently ignored: the library refuses what it does not implement ("Unimplemented keys")."""
import functools
import json
import re

import jsonschema
import llguidance

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.structured.enforceable import Unsatisfiable, enforceable
from kubeinfer.runtime.structured.json_layout import layout_options
from kubeinfer.runtime.structured.spec import StructuredOutput

OUTPUTS_KEPT = 256
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")
_ONE_OF = "oneOf constraints are not supported"


def check_meta_schema(schema, param: str) -> None:
    """Refuses a schema (an object or a boolean) that is not valid JSON Schema (draft 2020-12 unless it names its own
    `$schema`)."""
    if isinstance(schema, bool):
        return
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(validator(validator.META_SCHEMA).iter_errors(schema))
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path)
        raise InvalidRequestError(f"{param}: invalid JSON schema at {where or 'its root'}: {error.message}", param)


def json_schema_output(schema, param: str, kind: str = "json_schema", layout: str = "model") -> StructuredOutput:
    """The checked grammar of `schema` with what the finished answer is validated against; `layout`: "model" (the
    model's own whitespace, bounded: json_layout) or "compact" (none at all). Kept per schema text: an application
    sends one schema many times, and a large one costs (SchemaStore's Azure Pipelines: 0.4 s to check)."""
    if not isinstance(schema, dict | bool):
        raise InvalidRequestError(f"{param}: a JSON schema must be an object, got {type(schema).__name__}", param)
    return _output(json.dumps(schema), param, kind, layout)   # key order kept: it is the properties order


@functools.lru_cache(maxsize=OUTPUTS_KEPT)
def _output(schema_text: str, param: str, kind: str, layout: str) -> StructuredOutput:
    schema = json.loads(schema_text)
    check_meta_schema(schema, param)
    try:
        grammar_schema, approximated = enforceable(schema)
    except Unsatisfiable as error:
        raise InvalidRequestError(f"{param}: the schema is unsatisfiable: {error}", param) from error
    options = layout_options(grammar_schema) if layout == "model" else COMPACT
    grammar, message = _grammar(grammar_schema, options, param)
    if message is not None and _ONE_OF in message:   # oneOf the library cannot prove exclusive: anyOf, checked after
        grammar, message = _grammar(grammar_schema, dict(options, coerce_one_of=True), param)
        approximated = tuple(sorted({*approximated, "oneOf"}))
    if message is not None:
        if match := _UNIMPLEMENTED.search(message):
            keys = ", ".join(json.loads(match.group(1)))
            raise InvalidRequestError(f"{param}: the schema uses keywords that structured output cannot enforce: "
                                      f"{keys}", param)
        if message.startswith("Unsatisfiable schema"):
            raise InvalidRequestError(f"{param}: the schema is unsatisfiable: {message}", param)
        raise InvalidRequestError(f"{param}: the schema cannot be enforced: {message}", param)
    return StructuredOutput(grammar, kind, schema_text, approximated)


def _grammar(schema: dict, options: dict, param: str) -> tuple[str, str | None]:
    """The library's grammar and its first error (None when it compiles)."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=options)
    except ValueError as error:
        raise InvalidRequestError(f"{param}: {error}", param) from error
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return grammar, ((messages[0] if messages else "the schema cannot be enforced") if is_error else None)
