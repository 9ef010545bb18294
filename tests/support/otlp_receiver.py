"""A collector's receiving end, in the test: OTLP over HTTP (`POST /v1/traces`, protobuf `ExportTraceServiceRequest`,
decoded with the protocol's own `opentelemetry-proto` messages), on a free loopback port. Every span received is
kept with its service's name; `spans_of(trace_id)` reads them."""
from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict
    events: list[str]
    status_code: int   # 0 unset, 1 ok, 2 error
    resource: dict     # the sending process's resource attributes (service.name, k8s.pod.name, ...)


def _value(value: AnyValue):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._keep(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            attributes = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = attributes.get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        service, span.name, span.kind, span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(), span.start_time_unix_nano, span.end_time_unix_nano,
                        {a.key: _value(a.value) for a in span.attributes}, [e.name for e in span.events],
                        span.status.code, attributes))
        with self._lock:
            self.requests += 1
            self.spans.extend(received)

    def spans_of(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
