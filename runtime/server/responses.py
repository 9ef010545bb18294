"""OpenAI response bodies and stream chunks, built from engine outputs."""
import json

from kubeinfer.runtime.engine.messages import TokenLogprobs
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.server.tool_output import ToolOutput
from kubeinfer.runtime.tokenizer import Tokenizer


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text; a token that is only part of a character is named `token_id:<id>` instead, so that
    tokens stay distinct (as keys of the legacy top_logprobs dicts)."""
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    return f"token_id:{token_id}" if "\ufffd" in text else text


def text_offset(tokenizer: Tokenizer, output_token_ids: list[int], index: int) -> int:
    """Characters of the output text before token `index`: a character split over several tokens counts at
    its last one (the decoded prefix's incomplete tail, U+FFFD, is not a character yet)."""
    return len(tokenizer.decode(output_token_ids[:index], skip_special_tokens=True).rstrip("\ufffd"))


def completion_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprobs], output_token_ids: list[int],
                        first: int) -> dict:
    """The legacy completions format: parallel lists of tokens, logprobs, top alternatives, and the character
    offset of each token in the output text. `entries` are the logprobs of output tokens `first...`."""
    tokens = [token_text(tokenizer, entry.token_id) for entry in entries]
    offsets = [text_offset(tokenizer, output_token_ids, first + i) for i in range(len(entries))]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(tokenizer, t): lp for t, lp in e.top} or None
                             for e in entries],
            "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprobs]) -> dict:
    def item(token_id: int, logprob: float) -> dict:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [item(e.token_id, e.logprob) | {"top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}


class Formatter:
    """Shapes outputs for one endpoint: `chat` (chat.completion) or text completions."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str, tokenizer: Tokenizer,
                 want_logprobs: bool, tools: ToolOutput | None = None):
        self.chat, self.request_id, self.created, self.model = chat, request_id, created, model
        self.tokenizer, self.want_logprobs, self.tools = tokenizer, want_logprobs, tools

    def _envelope(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}

    def _logprobs(self, output: RequestOutput, entries: list[TokenLogprobs]):
        """Logprobs of `entries`, the last ones of `output.logprobs`."""
        if not self.want_logprobs:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer, entries)
        return completion_logprobs(self.tokenizer, entries, output.token_ids, len(output.logprobs) - len(entries))

    def response(self, outputs: list[RequestOutput], prompt_tokens: int) -> dict:
        choices = []
        for index, output in enumerate(outputs):
            choice = {"index": index, "logprobs": self._logprobs(output, output.logprobs),
                      "finish_reason": output.finish_reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": output.text}
                if self.tools is not None:
                    content, calls = self.tools.final(output.text, output.finish_reason)
                    if calls:
                        choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                        choice["finish_reason"] = "tool_calls"
            else:
                choice["text"] = output.text
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        cached = sum(o.num_cached_tokens for o in outputs)
        body["usage"] = usage(prompt_tokens, sum(len(o.token_ids) for o in outputs), cached)
        return body

    def role_chunk(self, index: int) -> str:
        return sse(self._envelope("chat.completion.chunk",
                                  [{"index": index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]))

    def chunk(self, index: int, output: RequestOutput) -> str | None:
        """The chunk for this output's new text; None when there is nothing to send yet."""
        if not output.new_text and not output.finished and not (self.want_logprobs and output.new_logprobs):
            return None
        choice = {"index": index, "logprobs": self._logprobs(output, output.new_logprobs),
                  "finish_reason": output.finish_reason if output.finished else None}
        if self.chat:
            choice["delta"] = {"content": output.new_text} if output.new_text else {}
            if self.tools is not None:
                content, calls = self.tools.step(index, output.text, output.finished, output.finish_reason)
                choice["delta"] = {"content": content} if content else {}
                if calls:
                    choice["delta"]["tool_calls"] = [dict(call, index=i) for i, call in enumerate(calls)]
                    choice["finish_reason"] = "tool_calls"
                if not choice["delta"] and not output.finished and choice["logprobs"] is None:
                    return None
            return sse(self._envelope("chat.completion.chunk", [choice]))
        choice["text"] = output.new_text
        return sse(self._envelope("text_completion", [choice]))

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> str:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return sse(body)
