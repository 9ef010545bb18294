"""Streams through the official `openai` client, run in threads, each recording whether it reached its end.

Used where a test must show that no stream is cut (a drain on SIGTERM, a rolling update, a scale-down):
a stream counts as whole only with `finish_reason` "length" and exactly `max_tokens` completion tokens in
the final usage chunk. Every stream is bounded (`max_tokens`, a client timeout), so a pool always ends.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import openai


@dataclasses.dataclass
class StreamResult:
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    first_token_s: float | None = None   # from the request to the first text chunk
    seconds: float | None = None
    error: str | None = None

    def whole(self, max_tokens: int) -> bool:
        return self.error is None and self.finish_reason == "length" and self.completion_tokens == max_tokens


def client(base_url: str, timeout_s: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout_s)


def stream_completion(api: openai.OpenAI, model: str, prompt: str, max_tokens: int,
                      on_first_token: threading.Event | None = None) -> StreamResult:
    result, started = StreamResult(), time.monotonic()
    try:
        stream = api.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                if choice.text and result.first_token_s is None:
                    result.first_token_s = time.monotonic() - started
                    if on_first_token is not None:
                        on_first_token.set()
                result.text += choice.text
                result.finish_reason = choice.finish_reason or result.finish_reason
            if chunk.usage is not None:
                result.completion_tokens = chunk.usage.completion_tokens
    except Exception as error:  # noqa: BLE001  (a cut stream is the finding, not a test crash)
        result.error = f"{type(error).__name__}: {error}"
    result.seconds = time.monotonic() - started
    return result


class StreamPool:
    """`count` concurrent streams; `wait_all_started()` returns once each has its first token."""

    def __init__(self, api: openai.OpenAI, model: str, count: int, max_tokens: int, prompt: str = "stream"):
        self.max_tokens = max_tokens
        self.results: list[StreamResult | None] = [None] * count
        self._first = [threading.Event() for _ in range(count)]
        self._threads = [threading.Thread(target=self._run, args=(api, model, f"{prompt} {i}", i), daemon=True)
                         for i in range(count)]
        for thread in self._threads:
            thread.start()

    def _run(self, api: openai.OpenAI, model: str, prompt: str, index: int) -> None:
        self.results[index] = stream_completion(api, model, prompt, self.max_tokens, self._first[index])

    def wait_all_started(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(event.wait(max(0.0, deadline - time.monotonic())) for event in self._first)

    def join(self, timeout_s: float) -> list[StreamResult]:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "streams still running after the timeout"
        return [r for r in self.results if r is not None]

    def cut(self) -> list[StreamResult]:
        """The finished streams that did not reach their end."""
        return [r for r in self.results if r is not None and not r.whole(self.max_tokens)]
