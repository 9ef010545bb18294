"""A stand-in for Prometheus' HTTP query API that counts the queries it answers.

Every InferenceService of one namespace is a series with labels namespace, service and model_name (the
service's name): an idle replica (queue 0, running 0, one pod reporting, no traffic so no TTFT). A query with
`service="X"` in it answers for that service only; any other query answers one sample per service, the way
`sum by (namespace, service, model_name, pool) (...)` does. The sample timestamp advances every 15 s, as a scrape
interval would.
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

SCRAPE_INTERVAL_S = 15
SERVICE = re.compile(r'service="([^"]+)"')


class FakePrometheus:
    def __init__(self, namespace: str, services: list[str], port: int) -> None:
        self.namespace, self.services = namespace, services
        self.queries: list[tuple[float, str]] = []
        server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        server.daemon_threads = True
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def since(self, start: float) -> list[str]:
        return [q for t, q in list(self.queries) if t >= start]

    def answer(self, query: str, at: float | None = None) -> list[dict]:
        """The samples of an instant query; `at`: its evaluation time (the `time` parameter; unused here)."""
        if query.startswith("histogram_quantile"):
            return []   # no requests, so no TTFT
        wanted = SERVICE.search(query)
        names = [wanted.group(1)] if wanted else self.services
        if query.startswith("count"):
            value = 1.0
        elif "timestamp(" in query:
            value = float(int(time.time()) // SCRAPE_INTERVAL_S * SCRAPE_INTERVAL_S)
        else:
            value = 0.0
        return [{"metric": {"namespace": self.namespace, "service": n, "model_name": n}, "value": [time.time(), str(value)]}
                for n in names]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                params = parse_qs(url.query)
                query = params.get("query", [""])[0]
                at = float(params["time"][0]) if "time" in params else None
                fake.queries.append((time.monotonic(), query))
                body = json.dumps({"status": "success",
                                   "data": {"resultType": "vector", "result": fake.answer(query, at)}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the operator stopped mid-answer

            def log_message(self, *args: object) -> None:
                pass

        return Handler
