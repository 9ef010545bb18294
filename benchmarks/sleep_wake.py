"""Sleep and wake against a cold start, per model (issue #51's first figure): `kubeinfer serve` started fresh each
repeat, then put to sleep and woken at each level, on the same box in the same run.

    python -P benchmarks/sleep_wake.py [--models demo smollm2-135m-instruct] [--repeats 3] [--dtype float32]

Per repeat and model:
- cold start: the server process started -> `/v1/models` answers (interpreter, imports, checkpoint, KV pool), then
  the first request's time to first token on top (what a scaled-to-zero model's first user waits, less the pod);
- awake TTFT: a short prompt's time to first token on the warm server (the floor);
- for level 1 and 2: `POST /sleep` (its seconds and what the engine's resident memory fell by), `POST /wake_up`
  (the engine's own seconds), then asleep again and a request's time to first token (the wake it causes included).
The engine's memory is the server's engine process's resident set (psutil), before sleep and asleep.
"""
import argparse
import statistics
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

PROMPT = "Kubernetes schedules pods onto nodes"


def first_token_seconds(url: str, model: str) -> float:
    started = time.monotonic()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                return time.monotonic() - started
    raise RuntimeError("the stream ended without a token")


def engine_rss(server) -> int:
    """The engine process's resident bytes: the server's child that is not the resource tracker."""
    children = [c for c in psutil.Process(server.pid).children() if "resource_tracker" not in " ".join(c.cmdline())]
    return max(c.memory_info().rss for c in children)


def one_repeat(args, model_name: str) -> dict:
    settings = SimpleNamespace(model=model_name, port=args.port, dtype=args.dtype, load_format="auto",
                               kv_cache_gib=args.kv_cache_gib)
    started = time.monotonic()
    server, url = serve.start_server(settings, None)
    figures = {}
    try:
        serve.wait_ready(url, server, timeout_s=600)
        figures["cold_ready"] = time.monotonic() - started
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        figures["cold_first_token"] = first_token_seconds(url, model)
        figures["awake_ttft"] = statistics.median(first_token_seconds(url, model) for _ in range(3))
        for level in (1, 2):
            awake_rss = engine_rss(server)
            slept = httpx.post(url + "/sleep", params={"level": level}, timeout=600).json()
            figures[f"l{level}_sleep"] = slept["seconds"]
            figures[f"l{level}_freed_mib"] = (awake_rss - engine_rss(server)) / 2**20
            figures[f"l{level}_wake"] = httpx.post(url + "/wake_up", timeout=600).json()["seconds"]
            httpx.post(url + "/sleep", params={"level": level}, timeout=600)
            figures[f"l{level}_asleep_ttft"] = first_token_seconds(url, model)
            figures["awake_rss_mib"] = awake_rss / 2**20
    finally:
        server.terminate()
        server.wait(60)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["demo", "smollm2-135m-instruct"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--kv-cache-gib", type=float, default=0)
    parser.add_argument("--port", type=int, default=18177)
    args = parser.parse_args()
    print(describe())
    runs = {name: [] for name in args.models}
    for repeat in range(args.repeats):   # models alternate, so drift in the box falls on each
        for name in args.models:
            runs[name].append(one_repeat(args, name))
            print(f"repeat {repeat + 1}/{args.repeats} {name}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in runs[name][-1].items()), flush=True)
    columns = ["cold_ready", "cold_first_token", "awake_ttft", "l1_sleep", "l1_wake", "l1_asleep_ttft",
               "l2_sleep", "l2_wake", "l2_asleep_ttft", "awake_rss_mib", "l1_freed_mib", "l2_freed_mib"]
    print("\nmedian over repeats (seconds; memory in MiB)\n| model | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, figures in runs.items():
        cells = [statistics.median(f[c] for f in figures) for c in columns]
        print(f"| {name} | " + " | ".join(f"{v:.0f}" if c.endswith("mib") else f"{v:.3f}"
                                           for c, v in zip(columns, cells)) + " |")


if __name__ == "__main__":
    main()
