"""Streams through a router in front of a replica that a test kills mid-stream (tests/runtime/router)."""
import contextlib
import json
from collections.abc import Callable

import httpx

from support import RuntimeServer


@contextlib.contextmanager
def victim_beside(replica, llama_dir, start_router, log):
    """A second replica (the victim) and a round-robin router over both that picks the victim first and scrapes
    so rarely that it learns what became of the victim only by trying it; yields (victim, router)."""
    victim = RuntimeServer(llama_dir, log, "--max-model-len", "512", "--cpu-threads", "1")
    try:
        victim.wait_ready()
        router = start_router([victim.url, replica.url], "--policy", "round-robin",
                              "--scrape-interval", "60", "--stale-after", "120").wait_up(2)
        yield victim, router
    finally:
        victim.stop()


def stream_events(url: str, path: str, body: dict, victim=None, kill_after: int = 3,
                  kill: Callable = lambda victim: victim.proc.kill()) -> tuple[list[dict], str]:
    """The `data:` events of a stream (the error event included) and the replica header; `victim` is killed
    (`kill(victim)`: SIGKILL to the whole replica) once `kill_after` events arrived (it must be the replica serving
    the stream)."""
    events = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        replica = response.headers.get("x-kubeinfer-replica")   # None: straight to a replica
        for line in response.iter_lines():
            assert not line.startswith(":"), line   # the replica's progress lines never reach the client
            if not line.startswith("data: "):
                continue
            events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
            if victim is not None and len(events) == kill_after:
                assert replica == victim.url
                kill(victim)
    return events, replica


def stream_text(events: list) -> str:
    choices = [c for e in events if e != "[DONE]" for c in e.get("choices", ())]
    return "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices)
