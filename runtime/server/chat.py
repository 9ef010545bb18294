"""Renders chat messages into a prompt with the model's chat template (Jinja, sandboxed)."""
from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kubeinfer.runtime.errors import InvalidRequestError


def _raise(message: str):
    raise TemplateError(message)


_environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_environment.globals["raise_exception"] = _raise
_environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)


def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str | None = None, eos_token: str | None = None, tools: list[dict] | None = None) -> str:
    """The prompt; `tools` (Hugging Face's shape) are rendered by templates that know them, as their model expects."""
    if template is None:
        raise InvalidRequestError("this model has no chat template; use /v1/completions", "messages")
    try:
        return _environment.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "", eos_token=eos_token or "", tools=tools)
    except TemplateError as error:
        raise InvalidRequestError(f"the chat template refused these messages: {error}", "messages") from error
