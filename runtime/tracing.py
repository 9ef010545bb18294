"""Traces of a request (OpenTelemetry), off unless an OTLP endpoint is set.

On with `--otlp-traces-endpoint URL` (the router's and the server's flag) or the standard variables
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`); `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` keep it off. Spans go out over OTLP/HTTP (protobuf) from the SDK's batch processor
(a background thread: the request path only records); the sampler is the SDK's, from `OTEL_TRACES_SAMPLER` /
`OTEL_TRACES_SAMPLER_ARG` (default: follow the parent, else sample all), the service name `OTEL_SERVICE_NAME` or
the process's role. W3C `traceparent`/`tracestate` are read from a request and written on the requests it makes.

Off, nothing here is imported beyond this module, and every caller's check is one `if tracer is None`.
"""
import os
import time
from urllib.parse import urlsplit

TRACES_PATH = "/v1/traces"
_tracer = None
_clock_offset_ns = 0   # epoch ns minus monotonic ns, taken once: the engine stamps times on the monotonic clock


def endpoint_from_environment() -> str | None:
    """The traces endpoint the standard variables name, or None when they name none (or turn tracing off)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + TRACES_PATH if base else None


def traces_url(endpoint: str) -> str:
    """`http://collector:4318` or `http://collector:4318/v1/traces`: both mean the collector's traces path."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the OTLP traces endpoint {endpoint!r} is not an http(s) URL (OTLP over HTTP: e.g. "
                         f"http://otel-collector:4318)")
    return endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + TRACES_PATH


def configure(service: str, endpoint: str | None = None) -> bool:
    """Turns tracing on for this process when `endpoint` or the environment names a collector; True if on."""
    global _tracer, _clock_offset_ns
    endpoint = endpoint or endpoint_from_environment()
    if endpoint is None:
        _tracer = None
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))   # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("kubeinfer")
    _clock_offset_ns = time.time_ns() - time.monotonic_ns()
    return True


def tracer():
    """The process's tracer, or None when tracing is off."""
    return _tracer


def shutdown() -> None:
    """Sends what is still buffered (the SDK also does so at exit)."""
    if _tracer is not None:
        from opentelemetry import trace
        trace.get_tracer_provider().shutdown()


def parent_of(headers) -> object | None:
    """The context a request's `traceparent` header names (None: the span starts a trace). `headers`: a mapping
    of lower-case names, or ASGI's list of (bytes, bytes)."""
    if isinstance(headers, list):
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers
                   if k.lower() in (b"traceparent", b"tracestate")}
    if "traceparent" not in headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    return TraceContextTextMapPropagator().extract({k: headers[k] for k in ("traceparent", "tracestate")
                                                    if k in headers})


def with_trace_headers(headers: list[tuple[bytes, bytes]], span) -> list[tuple[bytes, bytes]]:
    """`headers` with the client's trace headers replaced by `span`'s: the next hop's spans are its children."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    kept = [(k, v) for k, v in headers if k.lower() not in (b"traceparent", b"tracestate")]
    return kept + [(k.encode(), v.encode()) for k, v in carrier.items()]


def epoch_ns(monotonic_s: float) -> int:
    """A time on the monotonic clock (the engine's stamps, in any process of this host) as OpenTelemetry's."""
    return int(monotonic_s * 1e9) + _clock_offset_ns


def child_span(name: str, parent_span, start_ns: int, end_ns: int, attributes: dict | None = None) -> None:
    """A finished span under `parent_span` from times measured elsewhere (the engine's queue, prefill, decode)."""
    from opentelemetry import trace
    span = _tracer.start_span(name, context=trace.set_span_in_context(parent_span), start_time=start_ns,
                              attributes=attributes)
    span.end(end_time=max(start_ns, end_ns))
