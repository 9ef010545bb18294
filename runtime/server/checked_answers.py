"""A constrained request's outputs as the client gets them: every finished answer validated against the request's
schema (`answer_check`). Where the grammar alone guarantees it (`StructuredOutput.held` false), text streams as it
comes; where it only over-approximates, the answer is held and sent whole once it validates. An answer that does
not validate is never sent: the request fails with a 422 naming the schema rule it broke."""
import dataclasses
import logging

from kubeinfer.runtime.server.errors import APIError
from kubeinfer.runtime.structured.answer_check import violation
from kubeinfer.runtime.structured.spec import StructuredOutput

logger = logging.getLogger(__name__)
UNSATISFIED_CODE = "schema_not_satisfied"


class UnsatisfiedSchemaError(APIError):
    def __init__(self, structured: StructuredOutput, reason: str):
        checked = ", ".join(structured.approximated)
        how = (f" ({checked}: not enforceable while the answer is written, checked when it is finished)"
               if checked else "")
        super().__init__(422, f"the model's answer does not satisfy the schema {reason}{how}",
                         code=UNSATISFIED_CODE)


async def checked_outputs(outputs, structured: StructuredOutput):
    """`outputs` (an engine request's RequestOutputs) with the finished answer checked, held back when need be."""
    async for output in outputs:
        if not output.finished:
            if not structured.held:
                yield output
            continue
        if output.finish_reason == "stop" and not isinstance(output.stop_reason, str):
            # (cut by max_tokens, a stop string, or aborted, the answer is incomplete and says so by its reason)
            reason = violation(structured, output.text)
            if reason is not None:
                if not structured.held:   # the grammar should have made this impossible
                    logger.error("a %s answer broke its grammar's schema: %s", structured.kind, reason)
                raise UnsatisfiedSchemaError(structured, reason)
        yield _whole(output) if structured.held else output


def _whole(output):
    """The held answer as one output: everything new at once."""
    return dataclasses.replace(output, new_token_ids=list(output.token_ids), new_text=output.text,
                               new_logprobs=list(output.logprobs))
