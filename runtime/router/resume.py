"""Streams that survive their replica: what a client's stream has been sent, so another replica can continue it.

The router asks for it with the `x-kubeinfer-resumable: 1` header on a streamed completion or chat request of one
choice. The replica then puts SSE comment lines in its events (docs/router.md): `: ki-id <id> <created>` once, and
`: ki <characters of text sent so far> <new token ids>` in the event of each output. `StreamProgress` relays the
events without those lines and keeps, as of the last event relayed whole, the stream's id, its output token ids
and the characters of text sent. If the replica dies, `resume_body` is the same request with `kubeinfer_resume`:
the next replica prefills the prompt and those tokens and streams what follows, under the same id.

A replica whose engine died (the API process lives a moment longer, then exits) ends such a stream with its error
event marked `: ki-failed`: the router relays neither that event nor anything after it (`failed` says why) and
resumes the stream elsewhere, as if the connection had broken. A client without a router gets the error event.
"""
import json

RESUMABLE_HEADER = b"x-kubeinfer-resumable"
PROGRESS_PREFIX, ID_PREFIX = ": ki ", ": ki-id "   # the replica's SSE comment lines (`progress_line`, `id_line`)
FAILED_LINE = ": ki-failed\n"   # starts the event of a stream whose replica's engine died (`failed_event`)
_PROGRESS, _ID, _FAILED = PROGRESS_PREFIX.encode(), ID_PREFIX.encode(), FAILED_LINE.strip().encode()
RESUMABLE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_RESUMES = 3   # continuations (or retries) of one request: a request that kills every replica stops here


def is_resumable(path: str, parsed) -> bool:
    """A streamed completion or chat request of one choice (the replica still declines one with tools)."""
    return (path in RESUMABLE_PATHS and isinstance(parsed, dict) and parsed.get("stream") is True
            and parsed.get("n") in (1, None) and one_prompt(parsed.get("prompt")))


def one_prompt(prompt) -> bool:
    """A chat request (no prompt), a string, or one prompt of token ids: not a batch of prompts."""
    if prompt is None or isinstance(prompt, str):
        return True
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(p, int) for p in prompt)


def id_line(stream_id: str, created: int) -> str:
    """The replica's first event of a resumable stream: its id and creation time, as a comment-only event."""
    return f"{ID_PREFIX}{stream_id} {created}\n\n"


def progress_line(text_chars: int, new_token_ids: list[int]) -> str:
    """The comment line the replica puts in an output's event: text sent so far (characters), new token ids."""
    return f"{PROGRESS_PREFIX}{text_chars} {' '.join(map(str, new_token_ids))}\n"


def failed_event(error_event: str) -> str:
    """The replica's error event for a stream its dead engine cannot finish, marked so that a router resumes it."""
    return FAILED_LINE + error_event


class StreamProgress:
    def __init__(self):
        self.id: str | None = None     # set once the replica declared the stream resumable
        self.created = 0
        self.token_ids: list[int] = []
        self.text_chars = 0
        self.done = False              # `data: [DONE]` was relayed: nothing is left to resume
        self.failed: str | None = None  # the replica said its engine died (its error event): resume elsewhere
        self._pending = b""            # the start of an event not yet whole

    @property
    def resumable(self) -> bool:
        return self.id is not None and not self.done

    def feed(self, chunk: bytes) -> bytes:
        """The events completed by `chunk`, to relay as they are, without the progress lines, which are read."""
        data = self._pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b""
        self._pending = data[end + 2:]
        relayed = []
        for event in data[:end].split(b"\n\n"):
            lines = event.split(b"\n")
            if lines[0] == _FAILED:   # nothing of it, nor after it, is relayed
                self.failed = b"\n".join(lines[1:]).decode(errors="replace")[:500]
                self._pending = b""
                break
            kept = []
            for line in lines:
                if line.startswith(_PROGRESS):
                    chars, _, ids = line[len(_PROGRESS):].partition(b" ")
                    self.text_chars = int(chars)
                    self.token_ids.extend(map(int, ids.split()))
                elif line.startswith(_ID):
                    stream_id, created = line[len(_ID):].split()
                    self.id, self.created = stream_id.decode(), int(created)
                else:
                    kept.append(line)
            if kept:
                relayed.append(b"\n".join(kept) + b"\n\n")
                self.done = self.done or kept[-1] == b"data: [DONE]"
        return b"".join(relayed)

    def resume_body(self, parsed: dict) -> bytes:
        """The request again, continuing from what the client was sent."""
        resume = {"id": self.id, "created": self.created, "token_ids": self.token_ids, "text_chars": self.text_chars}
        return json.dumps(dict(parsed, kubeinfer_resume=resume)).encode()
