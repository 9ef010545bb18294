"""Cost of one `/metrics` scrape of the runtime, with 256 sequences running, in one run:

    python benchmarks/metrics_scrape.py [--running 256] [--steps 200]

Fills the server's own metrics (`EngineMetrics`) as 256 concurrent requests would over `--steps` engine
steps (every histogram observed, every gauge set, the vLLM-named gauges included), then times rendering the
registry, which is what `/metrics` serves, and the whole HTTP round trip through the app (FastAPI + uvicorn on
127.0.0.1, httpx keep-alive client). Median and P99 in microseconds, with and without the vLLM names.
"""
import argparse
import asyncio
import statistics
import sys
import threading
import time

from prometheus_client import generate_latest

from kubeinfer.runtime.engine.messages import EngineStats
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.server.metrics import EngineMetrics


def filled_metrics(running: int, steps: int, vllm_names: bool) -> EngineMetrics:
    metrics = EngineMetrics("model", vllm_names)
    metrics.observe_engine(16, 4096)
    metrics.observe_startup({"imports": 3.0, "weights": 1.0, "ready": 6.0})
    now = time.monotonic()
    for step in range(steps):
        now += 0.02
        for i in range(running):
            tokens = list(range(step + 1))
            output = RequestOutput(f"r{i}", [1, 2, 3], tokens, "", tokens[-1:], "", [], [], step == steps - 1,
                                   "length" if step == steps - 1 else None, None, 0, now - 0.02 * step - 0.1, now)
            metrics.record_output(output, now)
        metrics.observe_stats(EngineStats(running, 3, 0.5, 0, 100, 200), 0.02)
    return metrics


def percentiles_us(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"P50 {statistics.median(ordered) * 1e6:7.0f} us, P99 {ordered[int(0.99 * len(ordered))] * 1e6:7.0f} us"


def time_render(metrics: EngineMetrics, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        generate_latest(metrics.registry)
        samples.append(time.perf_counter() - started)
    return samples


def time_http(metrics: EngineMetrics, repeat: int) -> list[float]:
    """GET /metrics through a FastAPI app that serves exactly the runtime's /metrics route."""
    import httpx
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    app = FastAPI()

    @app.get("/metrics")
    async def scrape():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    samples = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(repeat):
            started = time.perf_counter()
            client.get("/metrics").raise_for_status()
            samples.append(time.perf_counter() - started)
    server.should_exit = True
    thread.join(5)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"## /metrics with {args.running} running sequences after {args.steps} steps")
    print("| names | bytes | render | HTTP round trip |\n|---|---|---|---|")
    for vllm_names in (True, False):
        metrics = filled_metrics(args.running, args.steps, vllm_names)
        size = len(generate_latest(metrics.registry))
        render = time_render(metrics, args.repeat)
        http = time_http(metrics, args.repeat // 4)
        print(f"| ours{' + vLLM' if vllm_names else ''} | {size} | {percentiles_us(render)} | "
              f"{percentiles_us(http)} |")
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    sys.exit(main())
