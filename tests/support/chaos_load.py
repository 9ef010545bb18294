"""Steady load for the chaos suite (tests/e2e/chaos): greedy requests through one URL, each request's outcome
classified, bounded and self-stopping.

`Load` keeps `concurrency` clients busy, each on its own prompt, each request on a new connection (so the
Service spreads connections over the router pods, and no kept-alive connection to a pod that went away is reused).
One request in `NON_STREAMED_EVERY` is not streamed. Every request ends as one of:

- `completed`: a stream that ended with `data: [DONE]`, `finish_reason` "length" and `max_tokens` completion tokens
  in its usage chunk (a non-streamed answer: 200 with `max_tokens` completion tokens);
- `failed`: a clean error, an OpenAI-style error body (any status but 200) or an SSE error event
  (`data: {"error": ...}`) that ended the stream;
- `lost`: anything else: a stream cut without an error event (a broken connection, an end without `[DONE]`),
  an answer that is neither a result nor an OpenAI error, a connection that could not be made, or a hang: no end
  within the request's bound.

The bound is derived from the request, not guessed: warm-up requests run first, unhurried; the slowest of them is
what one request takes under this load. A request may wait at the router for a replica up to the router's
`queue_timeout_s`, and be continued at most `MAX_RESUMES` times (each continuation at worst as long as a whole
request), so bound = queue_timeout_s + (MAX_RESUMES + 1) x slowest warm-up request.
A completed greedy request whose text differs from its prompt's warm-up text is counted (`differs`): a resumed
stream must equal an uninterrupted one.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections import Counter

import httpx

from kubeinfer.runtime.router.resume import MAX_RESUMES

NON_STREAMED_EVERY = 4
OUTCOMES = ("completed", "failed", "lost")


@dataclasses.dataclass
class Outcome:
    client: int
    outcome: str            # one of OUTCOMES
    detail: str             # why (lost, failed), or "" when completed
    streamed: bool
    started: float          # time.monotonic()
    seconds: float
    text: str = ""


class Load:
    """`concurrency` clients sending greedy requests of `max_tokens` to `base_url` (an OpenAI `/v1` base) until
    `finish()`; `limit_s` stops them by itself."""

    def __init__(self, base_url: str, model: str | list[str], concurrency: int, max_tokens: int,
                 queue_timeout_s: float, limit_s: float, api_keys: list[str] | None = None, prompt_repeat: int = 1,
                 bound_s: float | None = None):
        self.base_url, self.concurrency, self.max_tokens = base_url, concurrency, max_tokens
        self.prompt_repeat = prompt_repeat   # the prompt said this many times (long prompts: long KV transfers)
        self.models = [model] if isinstance(model, str) else model   # client c asks models[c % len]
        self.api_keys = api_keys                                      # and sends api_keys[c % len], if any
        self.queue_timeout_s, self.limit_s = queue_timeout_s, limit_s
        self.outcomes: list[Outcome] = []
        self.expected: dict[int, str] = {}   # each client's text from its warm-up request
        self.bound_s = bound_s   # given: no warm-up (a flood, whose requests may be refused from the start)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warm = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> Load:
        """Starts the clients; returns after the warm-up (one request per client, all completed)."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._warm.wait()
        if self._error is not None:
            raise self._error
        return self

    def finish(self) -> list[Outcome]:
        """Stops sending; waits for the requests in flight (each ends by its bound) and returns the outcomes."""
        self._stop.set()
        assert self._thread is not None and self.bound_s is not None
        self._thread.join(self.bound_s + 30)
        assert not self._thread.is_alive(), "the load did not stop within its requests' bound"
        if self._error is not None:
            raise self._error
        return self.outcomes

    def counts(self) -> Counter:
        return Counter(o.outcome for o in self.outcomes)

    def differs(self) -> int:
        """Completed streams whose text is not their prompt's uninterrupted (warm-up) text."""
        return sum(1 for o in self.outcomes if o.outcome == "completed" and o.client in self.expected
                   and o.text != self.expected[o.client])

    def prompt(self, client: int) -> str:
        return " ".join([f"Chaos client {client}: tell me about the history of container orchestration, part "
                         f"{client}."] * self.prompt_repeat)

    def model_of(self, client: int) -> str:
        return self.models[client % len(self.models)]

    def headers_of(self, client: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_keys[client % len(self.api_keys)]}"} if self.api_keys else {}

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:   # noqa: BLE001  (surfaced in start/finish)
            self._error = error
            self._warm.set()

    async def _main(self) -> None:
        deadline = time.monotonic() + self.limit_s
        if self.bound_s is None:
            # Warm-up: one streamed request per client at once, as unbounded as the test's own limit.
            warm = await asyncio.gather(*(self._one(c, True, self.limit_s) for c in range(self.concurrency)))
            bad = [o for o in warm if o.outcome != "completed"]
            if bad:
                raise AssertionError(f"warm-up requests did not complete: {bad[:3]}")
            self.expected = {c: o.text for c, o in enumerate(warm)}
            self.bound_s = self.queue_timeout_s + (MAX_RESUMES + 1) * max(o.seconds for o in warm)
        self._warm.set()

        async def client(c: int) -> None:
            n = 0
            while not self._stop.is_set() and time.monotonic() < deadline:
                n += 1
                self.outcomes.append(await self._one(c, n % NON_STREAMED_EVERY != 0, self.bound_s))
        await asyncio.gather(*(client(c) for c in range(self.concurrency)))

    async def _one(self, client: int, streamed: bool, bound_s: float) -> Outcome:
        started = time.monotonic()
        try:
            outcome, detail, text = await asyncio.wait_for(self._request(client, streamed), bound_s)
        except asyncio.TimeoutError:
            outcome, detail, text = "lost", f"hang: no end within the bound of {bound_s:.1f} s", ""
        return Outcome(client, outcome, detail, streamed, started, time.monotonic() - started, text)

    async def _request(self, client: int, streamed: bool) -> tuple[str, str, str]:
        body = {"model": self.model_of(client), "prompt": self.prompt(client), "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True}
        if streamed:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        # A new connection per request: no pool kept alive (the bound is the only timeout).
        limits = httpx.Limits(max_keepalive_connections=0)
        try:
            async with httpx.AsyncClient(limits=limits, timeout=None) as http:
                async with http.stream("POST", self.base_url + "/completions", json=body,
                                       headers=self.headers_of(client)) as response:
                    if response.status_code != 200:
                        return clean_error(response.status_code, await response.aread())
                    if not streamed:
                        return self._answer(await response.aread())
                    return await self._stream(response)
        except httpx.HTTPError as error:
            return "lost", f"{type(error).__name__}: {error}", ""

    def _answer(self, raw: bytes) -> tuple[str, str, str]:
        try:
            data = json.loads(raw)
            tokens, text = data["usage"]["completion_tokens"], data["choices"][0]["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "lost", f"200 with a body that is not an answer: {raw[:200]!r}", ""
        if tokens != self.max_tokens:
            return "lost", f"an answer of {tokens} tokens, not {self.max_tokens}", text
        return "completed", "", text

    async def _stream(self, response: httpx.Response) -> tuple[str, str, str]:
        text, finish, tokens = "", None, None
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                if finish == "length" and tokens == self.max_tokens:
                    return "completed", "", text
                return "lost", f"[DONE] after finish {finish!r} and {tokens} tokens", text
            data = json.loads(line[6:])
            if "error" in data:
                return "failed", f"error event: {data['error'].get('code')}: {data['error'].get('message')}", text
            for choice in data.get("choices") or ():
                text += choice.get("text") or ""
                finish = choice.get("finish_reason") or finish
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
        return "lost", f"stream cut without an error event after {len(text)} characters", text


def clean_error(status: int, raw: bytes) -> tuple[str, str, str]:
    """A refused request: `failed` with an OpenAI error body, `lost` with anything else."""
    try:
        error = json.loads(raw)["error"]
        return "failed", f"{status} {error.get('code')}: {error.get('message')}", ""
    except (ValueError, KeyError, TypeError):
        return "lost", f"{status} without an OpenAI error body: {raw[:200]!r}", ""
