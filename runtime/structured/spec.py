"""What crosses from the API process to the engine for a constrained request: the grammar, already checked. Plain
data (it travels inside SamplingParams over the engine's pipe)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class StructuredOutput:
    grammar: str        # an llguidance grammar (JSON text), as built by `formats`; the key of the compiled cache
    kind: str           # "json_schema", "json_object" or "tool_calls": for logs and errors
