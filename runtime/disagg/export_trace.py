"""A KV export's spans on the prefill replica (runtime/tracing.py), in the trace of the decode replica's request that
pulled it (the pull's `traceparent`); none when tracing is off here or the pull carried no context.

`kv export` (kind SERVER, the child of the decode replica's request span): from the pull's arrival in this engine to
its first token handed to the transport, after the last block (blocks go as their chunks are computed), or to its
failure; under it `queue` (to first scheduled) and `prefill` (to that first token). Made when the export ends,
from the engine's monotonic stamps, on the engine's thread: nothing per block or per step.
"""
from kubeinfer.runtime import tracing


def trace_export(traceparent: str | None, arrival_s: float, scheduled_s: float | None, ended_s: float,
                 num_blocks: int, num_skipped: int, error: str | None = None) -> None:
    tracer = tracing.tracer()
    if tracer is None or traceparent is None:
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode
    parent = tracing.parent_of({"traceparent": traceparent})
    start, end = tracing.epoch_ns(arrival_s), tracing.epoch_ns(ended_s)
    span = tracer.start_span("kv export", context=parent, kind=SpanKind.SERVER, start_time=start, attributes={
        "kubeinfer.kv.blocks": num_blocks, "kubeinfer.kv.blocks_skipped": num_skipped})
    if scheduled_s is not None:
        scheduled = tracing.epoch_ns(scheduled_s)
        tracing.child_span("queue", span, start, scheduled)
        tracing.child_span("prefill", span, scheduled, end)
    else:
        tracing.child_span("queue", span, start, end)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.set_attribute("error.type", error[:200])
    span.end(end_time=end)
