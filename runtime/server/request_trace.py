"""One request's spans on a replica (runtime/tracing.py; none when tracing is off).

The request's span (`chat {model}`, `text_completion {model}`: the GenAI conventions' name, kind SERVER) is the
child of the caller's `traceparent` (the router's, or a client's), from the request's arrival at the handler to
the end of its answer. Under it:

- `admission`: authentication, the tenant, quota and room, from arrival until the engine requests exist;
- per engine request (one per choice), from the engine's own monotonic stamps, made when it ends: `queue` (arrival
  in the engine to first scheduled), `prefill` (to the first token; `kv transfer` on a decode replica, whose
  prompt's KV comes from a prefill replica), `decode` (to the end);
- the end: an event `cancelled` when the client went away first, an error status when the answer failed.

Attributes follow OpenTelemetry's GenAI conventions where they exist (`gen_ai.request.*`, `gen_ai.response.*`,
`gen_ai.usage.*`) and the `gen_ai.latency.*` names vLLM and SGLang emit (seconds), so one dashboard reads all three.
Nothing is recorded per token: the request path pays one span's start, and the end its children.
"""
import contextlib
import time

from kubeinfer.runtime import tracing
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.server.engine_client import EngineDeadError
from kubeinfer.runtime.server.errors import APIError


class RequestTrace:
    def __init__(self, span, received_ns: int):
        self.span = span
        self.received_ns = received_ns
        self.admitted_ns: int | None = None
        self.kv_transfer = False
        self.ended = False
        self.outputs: list[RequestOutput | None] = []   # each engine request's latest output, kept by the stream

    def admitted(self, request_id: str, tenant: str, kv_source: str | None, num_prompt_tokens: int) -> None:
        self.admitted_ns = time.time_ns()
        self.kv_transfer = kv_source is not None
        self.span.set_attribute("gen_ai.usage.input_tokens", num_prompt_tokens)
        tracing.child_span("admission", self.span, self.received_ns, self.admitted_ns,
                           {"kubeinfer.tenant": tenant or "", "gen_ai.response.id": request_id})
        if kv_source is not None:
            self.span.set_attribute("kubeinfer.kv_source", kv_source)

    def traceparent(self) -> str:
        """The W3C header naming this request's span: the next hop's spans become its children."""
        return dict((k.decode(), v.decode()) for k, v in tracing.with_trace_headers([], self.span))["traceparent"]

    def finish(self, outputs: list[RequestOutput | None] | None = None, cancelled: bool = False) -> None:
        """Ends the request's span with its engine requests' stages; `outputs`: each one's last output (None: it
        never produced one; default: those the stream kept)."""
        if self.ended:
            return
        self.ended = True
        end_ns = time.time_ns()
        done = [o for o in (self.outputs if outputs is None else outputs) if o is not None]
        for index, output in enumerate(done):
            self._stages(output, end_ns, index if len(done) > 1 else None)
        if done:
            first = done[0]
            attributes = {
                "gen_ai.usage.output_tokens": sum(len(o.token_ids) for o in done),
                "kubeinfer.usage.cached_input_tokens": first.num_cached_tokens,
                "gen_ai.response.finish_reasons": [o.finish_reason or "" for o in done],
                "gen_ai.latency.e2e": (end_ns - self.received_ns) / 1e9,
            }
            if first.scheduled_time is not None:
                attributes["gen_ai.latency.time_in_queue"] = first.scheduled_time - first.arrival_time
            if first.first_token_time is not None:
                attributes["gen_ai.latency.time_to_first_token"] = (
                    (tracing.epoch_ns(first.first_token_time) - self.received_ns) / 1e9)
                if first.scheduled_time is not None:
                    attributes["gen_ai.latency.time_in_model_prefill"] = first.first_token_time - first.scheduled_time
                attributes["gen_ai.latency.time_in_model_decode"] = (
                    (end_ns - tracing.epoch_ns(first.first_token_time)) / 1e9)
            self.span.set_attributes(attributes)
        if cancelled:
            self.span.add_event("cancelled", {"reason": "the client went away"})
        self.span.end(end_time=end_ns)

    def fail(self, error: BaseException) -> None:
        """Ends the span with the answer's status and the error's kind; a server error (5xx) is an error status, a
        refused request (4xx) is not (OpenTelemetry's HTTP conventions), and both say why."""
        if self.ended:
            return
        self.ended = True
        from opentelemetry.trace import Status, StatusCode
        status = status_of(error)
        self.span.set_attributes({"http.response.status_code": status,
                                  "error.type": getattr(error, "code", None) or type(error).__name__})
        self.span.add_event("refused" if status < 500 else "failed", {"message": str(error)[:500]})
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, str(error)[:500]))
        self.span.end()

    def _stages(self, output: RequestOutput, end_ns: int, choice: int | None) -> None:
        attributes = {} if choice is None else {"kubeinfer.choice": choice}
        arrival = tracing.epoch_ns(output.arrival_time)
        scheduled = tracing.epoch_ns(output.scheduled_time) if output.scheduled_time is not None else None
        first = tracing.epoch_ns(output.first_token_time) if output.first_token_time is not None else None
        if scheduled is None:   # never scheduled: it waited until it ended (cancelled, refused)
            tracing.child_span("queue", self.span, arrival, end_ns, attributes)
            return
        tracing.child_span("queue", self.span, arrival, scheduled, attributes)
        prefill = "kv transfer" if self.kv_transfer else "prefill"
        tracing.child_span(prefill, self.span, scheduled, first if first is not None else end_ns,
                           attributes | {"kubeinfer.prompt_tokens": len(output.prompt_token_ids),
                                         "kubeinfer.cached_prompt_tokens": output.num_cached_tokens})
        if first is not None:
            tracing.child_span("decode", self.span, first, end_ns,
                               attributes | {"kubeinfer.output_tokens": len(output.token_ids)})


def status_of(error: BaseException) -> int:
    """The HTTP status the server's handlers answer `error` with (runtime/server/app.py)."""
    if isinstance(error, APIError):
        return error.status
    if isinstance(error, InvalidRequestError):
        return 400
    if isinstance(error, EngineDeadError):
        return 503
    return getattr(error, "status_code", 500)   # Starlette's HTTPException, else an unexpected error


def begin(request, operation: str, body) -> RequestTrace | None:
    """The request's trace, started at its arrival; None when tracing is off."""
    tracer = tracing.tracer()
    if tracer is None:
        return None
    from opentelemetry.trace import SpanKind
    received_ns = time.time_ns()
    attributes = {"gen_ai.operation.name": operation, "gen_ai.request.model": body.model or "",
                  "gen_ai.provider.name": "kubeinfer", "http.route": request.url.path}
    max_tokens = next((value for value in (getattr(body, name, None) for name in
                                           ("max_completion_tokens", "max_tokens", "max_output_tokens"))
                       if value is not None), None)
    for name, value in (("gen_ai.request.max_tokens", max_tokens),
                        ("gen_ai.request.temperature", getattr(body, "temperature", None)),
                        ("gen_ai.request.top_p", getattr(body, "top_p", None)),
                        ("gen_ai.request.choice.count", getattr(body, "n", None)),
                        ("kubeinfer.stream", getattr(body, "stream", None))):
        if value is not None:
            attributes[name] = value
    span = tracer.start_span(f"{operation} {body.model}", context=tracing.parent_of(request.headers),
                             kind=SpanKind.SERVER, start_time=received_ns, attributes=attributes)
    return RequestTrace(span, received_ns)


@contextlib.contextmanager
def failing(trace: RequestTrace | None):
    """Ends `trace` with the error when the handler raises before its answer exists (a 400, 401, 429...)."""
    try:
        yield
    except BaseException as error:
        if trace is not None:
            trace.fail(error)
        raise
