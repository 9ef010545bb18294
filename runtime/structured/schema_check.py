"""Checks a request's JSON schema before anything is generated: a schema that is not valid JSON Schema is a 400
naming the field (its path in the schema), and a keyword the grammar library cannot enforce is a 400 naming the
keyword. Nothing is silently ignored: the library refuses what it does not implement ("Unimplemented keys")."""
import json
import re

import jsonschema
import llguidance

from kubeinfer.runtime.errors import InvalidRequestError

# Compact JSON: no whitespace between tokens at all (a schema's own "x-guidance" cannot turn it back on), so a small
# model can never loop on spaces; key order follows the schema's "properties".
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")


def check_meta_schema(schema, param: str) -> None:
    """Refuses a schema that is not valid JSON Schema (draft 2020-12 unless it names its own `$schema`)."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param}: a JSON schema must be an object, got {type(schema).__name__}", param)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(validator(validator.META_SCHEMA).iter_errors(schema))
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path)
        raise InvalidRequestError(f"{param}: invalid JSON schema at {where or 'its root'}: {error.message}", param)


def json_schema_grammar(schema: dict, param: str) -> str:
    """The checked grammar of `schema`, as llguidance takes it."""
    check_meta_schema(schema, param)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
    except ValueError as error:
        raise InvalidRequestError(f"{param}: {error}", param) from error
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        message = messages[0] if messages else "the schema cannot be enforced"
        if match := _UNIMPLEMENTED.search(message):
            keys = ", ".join(json.loads(match.group(1)))
            raise InvalidRequestError(f"{param}: the schema uses keywords that structured output cannot enforce: "
                                      f"{keys}", param)
        raise InvalidRequestError(f"{param}: the schema cannot be enforced: {message}", param)
    return grammar
