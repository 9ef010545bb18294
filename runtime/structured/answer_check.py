"""The finished answer of a constrained request, checked against the user's own schema with a real validator
(`jsonschema`): what the grammar only over-approximates (`enforceable`) is decided here, and nothing that does not
validate leaves the server. Validators are built once per schema."""
import functools
import json

import jsonschema

from kubeinfer.runtime.structured.spec import StructuredOutput

VALIDATORS_KEPT = 256


def violation(structured: StructuredOutput, text: str) -> str | None:
    """Why `text` is not a valid answer for `structured`'s schema; None when it is."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError as error:
        return f"the answer is not JSON ({error.msg} at character {error.pos})"
    error = jsonschema.exceptions.best_match(_validator(structured.schema).iter_errors(instance))
    if error is None:
        return None
    where = "/" + "/".join(str(part) for part in error.absolute_path)
    return f"at {where}: {error.message} ({error.validator})"


@functools.lru_cache(maxsize=VALIDATORS_KEPT)
def _validator(schema_text: str):
    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)
