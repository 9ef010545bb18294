"""What tracing costs the hot path: the same streamed load against `kubeinfer serve` with tracing off and on,
alternating, side by side (issue #52's bound: inter-token latency within 1%).

    python -P benchmarks/tracing_cost.py [--shape smollm2-135m | --model smollm2-135m-instruct] [--concurrency 16]
                                         [--num-requests 64] [--repeats 3] [--min-output 128 --max-output 128]

"on": the server sends every request's spans (sampled: all) over OTLP/HTTP to a receiver in this process (the
collector protocol, decoded: tests/support/otlp_receiver.py), with the SDK's default batching; the figures also
count the spans received. Each repeat starts a fresh server per setting, off first then on, so drift in the box
falls on both. The requests carry no `traceparent`: the server starts each trace (the SDK's default sampler).

Then, because a 1% bound is below what one A/B run resolves on a noisy box, the cost itself: the CPU time one
request's spans take in this process (`request_trace.begin`, `admitted`, `finish` with a 128-token output: the
request span, admission, queue, prefill, decode), the batch processor's export to the receiver included (process
CPU time over `--span-requests` requests), set against the request rate and the cores of the run above.
"""
import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
import serve  # noqa: E402
from peers.machine import describe  # noqa: E402
from shapes import CPU_SHAPES, SHAPES  # noqa: E402
from support.otlp_receiver import OtlpReceiver  # noqa: E402


def one_setting(args, traced: bool, receiver: OtlpReceiver) -> dict:
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if traced:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.url
    server, url = serve.start_server(args, None)
    try:
        serve.wait_ready(url, server, timeout_s=600)
        model = serve.httpx.get(url + "/v1/models").json()["data"][0]["id"]
        asyncio.run(serve.one_warm_up(url, model))
        before = len(receiver.spans)
        figures = asyncio.run(serve.run(args, url, model))
    finally:
        server.terminate()
        server.wait(60)
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    figures["spans"] = len(receiver.spans) - before   # the last batch is sent when the server exits
    return figures


def span_cost(requests: int) -> float:
    """CPU seconds one request's spans cost in this process, export included: its CPU time over `requests`, the
    receiver in a process of its own (decoding is the collector's cost, not ours)."""
    from types import SimpleNamespace

    from kubeinfer.runtime import tracing
    from kubeinfer.runtime.engine.output_processor import RequestOutput
    from kubeinfer.runtime.server import request_trace
    receiver = subprocess.Popen(
        [sys.executable, "-P", "-c", "import time; from support.otlp_receiver import OtlpReceiver; "
                                     "r = OtlpReceiver(); print(r.url, flush=True); time.sleep(3600)"],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "tests")), stdout=subprocess.PIPE, text=True)
    try:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.stdout.readline().strip()
        # A queue that holds them all: the batch processor drops spans beyond its queue (2,048 by default) rather
        # than block, which a loop this fast would hit and a server at its request rate does not.
        os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(5 * requests)
        tracing.configure("tracing-cost")
        body = SimpleNamespace(model="m", max_tokens=128, temperature=0.0, top_p=1.0, n=1, stream=True)
        request = SimpleNamespace(url=SimpleNamespace(path="/v1/completions"), headers={})
        now = time.monotonic()
        output = RequestOutput("r-0", list(range(200)), list(range(128)), "", [], "", [], [], True, "length", None,
                               0, now, now + 0.01, scheduled_time=now + 0.001)
        started = time.process_time()
        for index in range(requests):
            trace = request_trace.begin(request, "text_completion", body)
            trace.admitted(f"r-{index}", "anonymous", None, 200)
            trace.finish([output])
        tracing.shutdown()   # the last batch sent: its CPU time counted too
        return (time.process_time() - started) / requests
    finally:
        receiver.kill()
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0])
    parser.add_argument("--model", help="a model folder or name (smollm2-135m-instruct) instead of --shape")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=100)
    parser.add_argument("--max-prompt", type=int, default=300)
    parser.add_argument("--min-output", type=int, default=128)
    parser.add_argument("--max-output", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=18124)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--span-requests", type=int, default=20000)
    args = parser.parse_args()
    args.kv_cache_gib, args.per_token, args.burst, args.request_rate = 0, True, False, 0.0
    receiver = OtlpReceiver()
    rows: list[tuple[int, str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        serve.prepare_model(args, Path(tmp))
        print(f"machine: {describe()}")
        print(f"model: {args.model}, {args.dtype}; {args.concurrency} streams, {args.num_requests} requests, "
              f"outputs {args.min_output}-{args.max_output} tokens; receiver {receiver.url}")
        for repeat in range(args.repeats):
            for traced in (False, True):
                name = "on" if traced else "off"
                print(f"\n### repeat {repeat + 1}, tracing {name}")
                started = time.monotonic()
                rows.append((repeat, name, one_setting(args, traced, receiver)))
                print(f"({time.monotonic() - started:.0f} s with start-up)")
    per_request = span_cost(args.span_requests)
    receiver.stop()
    cores = os.cpu_count() or 1
    print(f"\none request's spans: {per_request * 1e6:.0f} us of CPU, export included ({args.span_requests} requests)")
    if not rows:   # --repeats 0: the span cost alone
        return
    ms = lambda values, q: serve.quantile(values, q) * 1e3   # noqa: E731
    print(f"\n{'repeat':>6} {'tracing':<8}{'ITL P50':>9}{'ITL P95':>9}{'TTFT P50':>10}{'tok/s':>8}{'spans':>7}")
    for repeat, name, f in rows:
        print(f"{repeat + 1:>6} {name:<8}{ms(f['itl'], .5):>9.2f}{ms(f['itl'], .95):>9.2f}{ms(f['ttft'], .5):>10.0f}"
              f"{f['tokens_per_s']:>8.1f}{f['spans']:>7}")
    ratios = [statistics.median(on["itl"]) / statistics.median(off["itl"])
              for (_, _, off), (_, _, on) in zip(rows[0::2], rows[1::2])]
    print(f"ITL P50 on / off per repeat: {', '.join(f'{r:.4f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.4f}")
    rate = statistics.mean(f["tokens_per_s"] for _, name, f in rows if name == "on") / args.max_output
    print(f"at this run's {rate:.2f} requests/s the spans take {per_request * rate * 100:.3f}% of one core, "
          f"{per_request * rate * 100 / cores:.3f}% of the box's {cores}")

if __name__ == "__main__":
    main()
