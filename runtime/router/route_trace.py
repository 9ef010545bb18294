"""One request's spans at the router (runtime/tracing.py; none when tracing is off).

- `POST {path}` (kind SERVER), the child of the client's `traceparent`: from the request's arrival at the router to
  the end of the answer it relayed; its tenant, the replica that answered, the status of a refusal.
- `admission`: the tenant's gate (its in-flight bound) at the router.
- per attempt (the first, a retry elsewhere, the resume of a cut stream): `pick` (the waiting room, an adapter's
  load, the choice: which replica and why: `prefix`, `load`, `adapter`, `response`), then `POST {replica}` (kind
  CLIENT) whose context goes to the replica as its `traceparent`, so the replica's spans are its children; it ends
  with the relayed answer, or when the attempt failed (`error.type` says how).
"""
import time

from kubeinfer.runtime import tracing


class RouteTrace:
    def __init__(self, span):
        self.span = span
        self.attempt = None         # the open CLIENT span to a replica
        self.pick_started_ns: int | None = None

    def admitted(self, tenant: str, started_ns: int) -> None:
        self.span.set_attribute("kubeinfer.tenant", tenant or "")
        tracing.child_span("admission", self.span, started_ns, time.time_ns(), {"kubeinfer.tenant": tenant or ""})

    def picking(self) -> None:
        """A pick starts (the waiting room first); the previous attempt, if still open, went nowhere."""
        self.attempt_ended("retried elsewhere")
        self.pick_started_ns = time.time_ns()

    def sending(self, headers: list[tuple[bytes, bytes]], replica_url: str, reason: str, waited_s: float,
                loading_s: float) -> list[tuple[bytes, bytes]]:
        """The pick's span, and the attempt's CLIENT span opened: `headers` carrying its context."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind
        now = time.time_ns()
        pick = {"kubeinfer.replica": replica_url, "kubeinfer.pick.reason": reason,
                "kubeinfer.waiting_room_s": waited_s, "kubeinfer.adapter_load_s": loading_s}
        tracing.child_span("pick", self.span, self.pick_started_ns or now, now, pick)
        self.attempt_ended("retried elsewhere")
        self.attempt = tracing.tracer().start_span(
            f"POST {replica_url}", context=trace.set_span_in_context(self.span), kind=SpanKind.CLIENT,
            start_time=now, attributes={"server.address": replica_url, "kubeinfer.pick.reason": reason})
        self.span.set_attribute("kubeinfer.replica", replica_url)
        return tracing.with_trace_headers(headers, self.attempt)

    def answered(self, status: int) -> None:
        """The replica's answer started with `status`."""
        self.attempt.set_attribute("http.response.status_code", status)

    def attempt_ended(self, error: str | None = None, status: int | None = None) -> None:
        if self.attempt is None:
            return
        if status is not None:
            self.attempt.set_attribute("http.response.status_code", status)
        if error is not None:
            self.attempt.set_attribute("error.type", error)
        self.attempt.end()
        self.attempt = None

    def end(self, status: int | None = None, error: str | None = None) -> None:
        self.attempt_ended(error)
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode
            self.span.set_status(Status(StatusCode.ERROR, error[:500]))
        self.span.end()


class Untraced(RouteTrace):
    """Tracing off: every step a no-op, so the proxy calls them unconditionally (one method call each)."""

    def __init__(self):
        super().__init__(None)

    def admitted(self, tenant: str, started_ns: int) -> None:
        pass

    def picking(self) -> None:
        pass

    def sending(self, headers, replica_url, reason, waited_s, loading_s):
        return headers

    def answered(self, status: int) -> None:
        pass

    def attempt_ended(self, error: str | None = None, status: int | None = None) -> None:
        pass

    def end(self, status: int | None = None, error: str | None = None) -> None:
        pass


UNTRACED = Untraced()


def begin(scope: dict) -> RouteTrace:
    """The request's trace at the router, started now; `UNTRACED` when tracing is off."""
    tracer = tracing.tracer()
    if tracer is None:
        return UNTRACED
    from opentelemetry.trace import SpanKind
    span = tracer.start_span(f"POST {scope['path']}", context=tracing.parent_of(scope["headers"]),
                             kind=SpanKind.SERVER, attributes={"http.route": scope["path"],
                                                               "http.request.method": "POST"})
    return RouteTrace(span)
