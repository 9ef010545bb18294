"""Request bodies of the OpenAI API as we accept them (pydantic), and their mapping to SamplingParams.

Unknown fields are ignored, as OpenAI's own clients may send fields we do not model. The engine's extra
sampling fields (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
`skip_special_tokens`) are accepted as vLLM accepts them.
"""
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.structured.formats import response_format_output
from kubeinfer.runtime.structured.spec import StructuredOutput

MAX_N = 16


class StreamOptions(BaseModel):
    include_usage: bool = False


class Resume(BaseModel):
    """`kubeinfer_resume`: the router's continuation of a stream whose replica died (docs/router.md). The output
    token ids the stream had covered, how many characters of their text its client was sent, and the stream's id
    and creation time, which the continuation keeps."""
    model_config = ConfigDict(extra="forbid")

    id: str
    created: int
    token_ids: list[int]   # none yet: the stream had started (its id, a chat's role chunk), no token
    text_chars: int = Field(ge=0)


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    # Extra fields, as vLLM accepts them
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None   # OpenAI's: token id (a string key in JSON) -> bias in [-100, 100]
    cache_salt: str | None = None   # vLLM's: only requests with the same salt share prefix cache blocks
    kubeinfer_resume: Resume | None = None   # set by the router only (see `Resume`)
    # A decode replica: the prefill replica's KV endpoint (IP:PORT) this request's prompt KV is pulled from; set by
    # the router only, which drops it from clients' bodies (docs/disaggregation.md, "Who may name a KV source")
    kubeinfer_kv_source: str | None = None
    kubeinfer_kv_source_signature: str | None = None   # the router's, with --kv-source-key-file (source_signature)

    def structured_output(self, layout: str = "model") -> StructuredOutput | None:
        """The grammar the output must match (checked: a bad format or schema is a 400 naming it)."""
        return response_format_output(self.response_format, layout=layout)

    def sampling_params(self, max_tokens: int, logprobs: int | None, choice: int,
                        structured: StructuredOutput | None = None) -> SamplingParams:
        """The engine's settings for choice `choice` of `n` (a seed gives each choice its own stream)."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=self.min_p or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=None if self.seed is None else self.seed + choice,
            stop=stop, stop_token_ids=self.stop_token_ids or [], min_tokens=min(self.min_tokens, max_tokens),
            ignore_eos=self.ignore_eos, logprobs=logprobs, skip_special_tokens=self.skip_special_tokens,
            structured=structured, logit_bias=_logit_bias(self.logit_bias), cache_salt=self.cache_salt,
        )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's map keys token ids as strings; one that is not an integer is a 400 naming logit_bias."""
    try:
        return {int(token): float(value) for token, value in (bias or {}).items()}
    except ValueError:
        raise InvalidRequestError("logit_bias keys must be token ids (integers)", "logit_bias") from None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [prompt]
        return list(prompt)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def template_message(self, index: int) -> dict[str, Any]:
        """The message as chat templates take it."""
        message: dict[str, Any] = {"role": self.role, "content": self.text(index)}
        for name in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, name) is not None:
                message[name] = getattr(self, name)
        return message

    def text(self, index: int = 0) -> str:
        """The message's text; a content part that is not text is refused in the user's terms."""
        if not isinstance(self.content, list):
            return self.content or ""
        for part in self.content:
            if part.type != "text":
                raise InvalidRequestError(f"messages[{index}]: a content part of type {part.type!r} is not supported; "
                                          "this server takes text only (parts of type 'text')", "messages")
            if part.text is None:
                raise InvalidRequestError(f"messages[{index}]: a content part of type 'text' needs a 'text' field",
                                          "messages")
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[dict] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
