"""A constrained request's outputs as the client gets them: every finished answer validated against the request's
schema (`answer_check`). Where the grammar alone guarantees it (`StructuredOutput.held` false), text streams as it
comes; where it only over-approximates, the answer is held and sent whole once it validates. An answer that does
not validate is never sent. A held one that fails is sampled again, up to RESAMPLES times, when its request samples
(temperature > 0; a greedy answer would come out the same): the client never saw it, so it gets the first answer
that validates. When none does, or the answer was not held, the request fails with a 422 naming the rule broken.
Every answer thrown away was computed all the same: its tokens go to `discarded` (the key's quota charges them)."""
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.errors import APIError
from kubeinfer.runtime.structured.answer_check import violation
from kubeinfer.runtime.structured.spec import StructuredOutput

logger = logging.getLogger(__name__)
UNSATISFIED_CODE = "schema_not_satisfied"
RESAMPLES = 2
SEED_STRIDE = 0x9E3779B97F4A7C15   # a seeded request's n-th resample uses seed + n * this (mod 2**64): reproducible


class UnsatisfiedSchemaError(APIError):
    def __init__(self, structured: StructuredOutput, reason: str, attempts: int = 1, tokens: int = 0):
        checked = ", ".join(structured.approximated)
        how = (f" ({checked}: not enforceable while the answer is written, checked when it is finished)"
               if checked else "")
        tried = f"; {attempts} answers sampled, none did" if attempts > 1 else ""
        super().__init__(422, f"the model's answer does not satisfy the schema {reason}{how}{tried}",
                         code=UNSATISFIED_CODE)
        self.reason = reason
        self.tokens = tokens   # the thrown-away answer's tokens


def resampled(params: SamplingParams, attempt: int) -> SamplingParams:
    """The sampling settings of a held answer's `attempt`-th new draw: a seeded request's seed moves on."""
    seed = None if params.seed is None else (params.seed + attempt * SEED_STRIDE) % 2**64
    return dataclasses.replace(params, seed=seed)


async def checked_outputs(outputs: AsyncIterator, structured: StructuredOutput,
                          again: Callable[[int], AsyncIterator] | None = None, resamples: int = RESAMPLES,
                          discarded: Callable[[int], None] | None = None):
    """`outputs` (an engine request's RequestOutputs) with the finished answer checked, held back when need be.
    `again(attempt)`: a new draw of the same request, for a held answer that failed (None: no resampling);
    `discarded(tokens)`: told of the tokens of every answer that failed its check (computed, never sent whole)."""
    for attempt in range(resamples + 1):
        try:
            async for output in _checked(outputs, structured):
                yield output
            return
        except UnsatisfiedSchemaError as error:
            if discarded is not None:
                discarded(error.tokens)
            if again is None or not structured.held or attempt == resamples:
                if attempt:
                    raise UnsatisfiedSchemaError(structured, error.reason, attempt + 1) from error
                raise
            logger.info("a held %s answer does not satisfy its schema %s; sampling it again (%d of %d)",
                        structured.kind, error.reason, attempt + 1, resamples)
            outputs = again(attempt + 1)


async def _checked(outputs: AsyncIterator, structured: StructuredOutput):
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
                raise UnsatisfiedSchemaError(structured, reason, tokens=len(output.token_ids))
        yield _whole(output) if structured.held else output


def _whole(output):
    """The held answer as one output: everything new at once."""
    return dataclasses.replace(output, new_token_ids=list(output.token_ids), new_text=output.text,
                               new_logprobs=list(output.logprobs))
