"""Stand-in engines of a model pool's replica for the operator's tests: one HTTP server per model on consecutive
loopback ports, each answering /metrics with its sleep level and wake-ups as the runtime writes them
(`kubeinfer_engine_sleep_level`, `kubeinfer_engine_wakeups_total{cause}`)."""
from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

from support import free_port_run


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        level, wakeups = self.server.states[self.server.server_port]
        body = (f'kubeinfer_engine_sleep_level{{model_name="m"}} {float(level)}\n'
                f'kubeinfer_engine_wakeups_total{{cause="request",model_name="m"}} {float(wakeups)}\n'
                f'kubeinfer_engine_wakeups_total{{cause="api",model_name="m"}} 0.0\n').encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def stand_in_engines(states: list[tuple[int, int]]) -> Iterator[tuple[int, dict[int, tuple[int, int]]]]:
    """Serves `states` ((sleep level, wake-ups) per model) on consecutive ports; yields (the first port, the states
    by port, which the test may change while they serve)."""
    first = free_port_run(len(states))
    by_port = {first + i: state for i, state in enumerate(states)}
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", port), _Engine) for port in by_port]
    for server in servers:
        server.states = by_port
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield first, by_port
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
