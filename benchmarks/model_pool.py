"""A model pool on one box (issue #51, part 3): what a request pays when the router must swap models, against a model
already awake and against a cold start, on the same box in the same run.

    python -P benchmarks/model_pool.py [--model smollm2-135m-instruct] [--repeats 5] [--sleep-level 1]

`kubeinfer pool` runs two engines of the model (served as `a` and `b`, at most one awake; the same weights, so the
two swap costs are alike) and `kubeinfer router --pool-model` fronts them. Each repeat:
- awake: a short prompt's time to first token through the router, its model awake (the floor);
- swap: the same for the other model, asleep: the router puts the awake one to sleep, wakes this one, forwards;
- cold: a fresh `kubeinfer serve` of the model: process start -> `/v1/models` answers, plus the first request's
  time to first token (what a scaled-to-zero model's first user waits, less the pod's scheduling and image).
Also: the pool's start (launcher start -> both engines started, the first asleep), the router's own swap seconds
(`kubeinfer_router_pool_wake_seconds`), and the pod's resident memory (launcher and engines) with one model awake.
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import serve  # noqa: E402
from peers.machine import describe  # noqa: E402
from sleep_wake import first_token_seconds  # noqa: E402


def tree_rss_mib(pid: int) -> float:
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


def metric_sum(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_pool(args) -> tuple[subprocess.Popen, subprocess.Popen, str, float]:
    port = args.port
    started = time.monotonic()
    launcher = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING", "pool",
                                 "--member", f"a={args.model}", "--member", f"b={args.model}", "--max-awake", "1",
                                 "--sleep-level", str(args.sleep_level), "--host", "127.0.0.1", "--port", str(port),
                                 "--", "--dtype", args.dtype])
    serve.wait_ready(f"http://127.0.0.1:{port + 1}", launcher, timeout_s=600)
    pool_start = time.monotonic() - started
    router_url = f"http://127.0.0.1:{port + 10}"
    router = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING",
                               "router", "--upstream", "http://127.0.0.1", "--pool-model", f"a={port}",
                               "--pool-model", f"b={port + 1}", "--pool-sleep-level", str(args.sleep_level),
                               "--host", "127.0.0.1", "--port", str(port + 10)])
    serve.wait_ready(router_url, router, timeout_s=60)
    while metric_sum(router_url, "kubeinfer_router_replicas_up") < 2:
        time.sleep(0.1)
    return launcher, router, router_url, pool_start


def cold_start(args) -> tuple[float, float]:
    settings = SimpleNamespace(model=args.model, port=args.port + 20, dtype=args.dtype, load_format="auto",
                               kv_cache_gib=0)
    started = time.monotonic()
    server, url = serve.start_server(settings, None)
    try:
        serve.wait_ready(url, server, timeout_s=600)
        ready = time.monotonic() - started
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        return ready, first_token_seconds(url, model)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sleep-level", type=int, choices=(1, 2), default=1)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--port", type=int, default=18277)
    args = parser.parse_args()
    print(describe())
    figures = {"awake_ttft": [], "swap_ttft": [], "cold_ready": [], "cold_first_token": []}
    launcher, router, url, pool_start = start_pool(args)
    try:
        first_token_seconds(url, "b")   # warm: b started awake
        awake = "b"
        rss = tree_rss_mib(launcher.pid)
        for repeat in range(args.repeats):
            figures["awake_ttft"].append(first_token_seconds(url, awake))
            awake = "a" if awake == "b" else "b"
            figures["swap_ttft"].append(first_token_seconds(url, awake))
            ready, first = cold_start(args)   # alternated with the pool's figures, so drift falls on both
            figures["cold_ready"].append(ready)
            figures["cold_first_token"].append(first)
            print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in figures.items()),
                  flush=True)
        swaps = metric_sum(url, "kubeinfer_router_pool_wake_seconds_count")
        router_swap = metric_sum(url, "kubeinfer_router_pool_wake_seconds_sum") / max(1.0, swaps)
    finally:
        router.terminate()
        launcher.terminate()
        router.wait()
        launcher.wait()
    median = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\n{args.model}, sleep level {args.sleep_level}, medians of {args.repeats} (seconds)")
    print("| pool start (2 engines) | TTFT awake | TTFT with a swap | router's swap (mean) | cold start -> ready "
          "| + first token | cold total | pod RSS, one awake (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {pool_start:.2f} | {median['awake_ttft']:.3f} | {median['swap_ttft']:.3f} | {router_swap:.3f} | "
          f"{median['cold_ready']:.2f} | {median['cold_first_token']:.3f} | "
          f"{median['cold_ready'] + median['cold_first_token']:.2f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
