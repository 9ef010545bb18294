"""What crosses from the API process to the engine for a constrained request: the grammar, already checked, and the
user's schema the finished answer is checked against. Plain data (it travels inside SamplingParams over the engine's
pipe)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class StructuredOutput:
    grammar: str        # an llguidance grammar (JSON text), as built by `schema_check`; the key of the compiled cache
    kind: str           # "json_schema", "json_object" or "tool_calls": for logs and errors
    schema: str = "{}"  # the user's JSON schema (JSON text): every finished answer is validated against it
    approximated: tuple[str, ...] = ()   # keywords the grammar only over-approximates (`enforceable`)

    @property
    def held(self) -> bool:
        """Whether the answer is held back until it is checked: the grammar alone cannot guarantee it validates."""
        return bool(self.approximated)
