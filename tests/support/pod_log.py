"""A pod's log, followed from a thread while a fault runs (the chaos suite): what a force-deleted replica said
between its SIGTERM and its end, which the API server cannot show once the pod object is gone.

`LogTail(kube, ns, pod).start()` opens `GET .../pods/{pod}/log?follow=true` (the API server streams it from the
kubelet for as long as the container runs) and keeps every line; `lines()` reads them. The stream ends by itself
when the container ends; `stop()` closes it sooner.
"""
from __future__ import annotations

import re
import threading
from typing import Any

# runtime/server/main.py's drain: "draining: N requests in flight, up to T s", then "drained" when none is left
# (the process exits at once), or "drain timeout: ..." (or nothing: SIGKILL came first).
DRAINING = re.compile(r"draining: (\d+) requests in flight")


class LogTail:
    def __init__(self, kube: Any, ns: str, pod: str, container: str | None = None):
        self.kube, self.path = kube, f"/api/v1/namespaces/{ns}/pods/{pod}/log"
        self.query = "follow=true&sinceSeconds=5" + (f"&container={container}" if container else "")
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def start(self, timeout_s: float = 30) -> LogTail:
        """Returns once the API server answered (the stream is open: no line after this is missed)."""
        self._thread.start()
        if not self._opened.wait(timeout_s):
            raise TimeoutError(f"the log stream of {self.path} did not open within {timeout_s} s")
        return self

    def stop(self) -> None:
        if self._response is not None:
            self._response.response.close()
        self._thread.join(5)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def in_flight_at_sigterm(self) -> int | None:
        """The requests the runtime held when its drain began (SIGTERM), or None if it never said."""
        found = [int(m.group(1)) for line in self.lines() if (m := DRAINING.search(line))]
        return found[0] if found else None

    def drained(self) -> bool:
        """The runtime said it finished every request before it exited (nothing of it was cut)."""
        return any(line.rstrip().endswith("drained") for line in self.lines())

    def _follow(self) -> None:
        api = self.kube.api
        try:
            method, url, headers, body, _ = api.param_serialize("GET", f"{self.path}?{self.query}",
                                                                header_params={"Accept": "*/*"},
                                                                auth_settings=["BearerToken"])
            self._response = api.call_api(method, url, header_params=headers, body=body)
        finally:
            self._opened.set()
        pending = b""
        try:
            for chunk in self._response.response.stream(1024, decode_content=True):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                with self._lock:
                    self._lines.extend(line.decode(errors="replace") for line in complete)
        except Exception:   # noqa: BLE001  (the container ended, or stop() closed the stream)
            pass
