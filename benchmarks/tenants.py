"""Fairness between tenants through HTTP: what a small tenant gets while a big one floods the server.

Starts `kubeinfer serve` (the CPU demo model) with two API keys, tenants A and B, and a small running set
(`--max-num-seqs`, so that requests wait and the queue's order decides). B sends Poisson arrivals at `--rate-b`;
A sends `--flood` times as many. Three phases, each on a fresh server: B alone (fcfs), B under A's flood with
fcfs, and the same with `--scheduling-policy fair`. Then the weighted phase: A and B both flooding, weights 3:1,
and the share of output tokens each got against the 3:1 target. Then the priority phases: B a class above A
(`priority=0` against A's `priority=1`) under A's flood, fair, with priority preemption (the default: B's request
takes the place of A's newest running ones) and with `--no-priority-preemption` (B waits for a running sequence
to end, still ahead of A's waiting ones). Prints B's TTFT P50/P95 per phase and A's output tokens/s (A keeps what
B leaves). Each tenant's client runs in its own process (in one event loop, A's hundreds of streams delayed the
reading of B's first tokens by seconds), and each phase also prints the TTFT P95 the server measured per tenant.

    python benchmarks/tenants.py [--seconds 40] [--rate-b 0.5] [--flood 10] [--max-num-seqs 8]
                                 [--phases solo,fcfs,fair,weighted,priority]
"""
import argparse
import asyncio
import json
import multiprocessing
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
from peers.machine import describe   # noqa: E402

PHASES = ("solo", "fcfs", "fair", "weighted", "priority")
WORDS = "pods nodes GPUs queues tokens replicas kernels caches routers batches prompts streams".split()


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def server_ttft_p95(metrics_text: str) -> dict[str, float]:
    """Each tenant's TTFT P95 in ms as the server measured it (from the request's arrival in the API process, its
    per-tenant histogram, interpolated as PromQL does): beside the client's, it splits the time to first token
    into the server's part and what came before (the client, the connection, the API process reading the body).
    Every request the server saw counts, finished or not."""
    from kubeinfer.operator.autoscaling.signals.metrics_histogram import histogram_quantile
    buckets: dict[str, list[tuple[float, float]]] = {}
    for line in metrics_text.splitlines():
        if line.startswith("kubeinfer_tenant_time_to_first_token_seconds_bucket{"):
            labels, value = line.rsplit(" ", 1)
            tenant = labels.split('tenant="', 1)[1].split('"', 1)[0]
            bound = labels.split('le="', 1)[1].split('"', 1)[0]
            buckets.setdefault(tenant, []).append((float(bound), float(value)))
    return {tenant: (p95 or float("nan")) * 1e3 for tenant, pairs in buckets.items()
            if (p95 := histogram_quantile(0.95, pairs)) is not None}


async def one_request(session, url: str, key: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}
    start, times, finished = time.monotonic(), [], False
    async with session.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status != 200:
            return {"status": r.status, "times": [], "finished": False}
        async for raw in r.content:
            if raw.startswith(b"data: {"):
                times.append(time.monotonic())   # one event per token (a token of no text yet: none)
            finished = finished or raw.startswith(b"data: [DONE]")
    return {"status": 200, "ttft": times[0] - start, "times": times, "finished": finished}


async def arrivals(session, url: str, key: str, rate: float, until: float, rng: random.Random) -> list:
    """Poisson arrivals at `rate` until `until` (time.monotonic()); prompts of 150-250 words, 64 tokens out."""
    tasks = []
    while time.monotonic() < until:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(150, 250)))
        tasks.append(asyncio.ensure_future(one_request(session, url, key, prompt, 64)))
        await asyncio.sleep(rng.expovariate(rate))
    return tasks


def start(policy: str, keys_file: str, args, port: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    command = [sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING", "serve", "--model",
               "demo", "--served-model-name", "demo", "--host", "127.0.0.1", "--port", str(port), "--api-keys-file", keys_file,
               "--max-num-seqs", str(args.max_num_seqs), "--max-waiting-requests", "4096",
               "--scheduling-policy", policy, *extra]
    with socket.socket() as probe:   # else the phase would measure whichever server holds the port
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            sys.exit(f"port {port} is taken (a server left from another run?): free it or pass --port")
    server = subprocess.Popen(command, env=os.environ.copy())
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.kill()
    sys.exit("the server did not become ready")


def tenant_client(url: str, tenant: str, rate: float, until: float, finish: bool, stop, queue) -> None:
    """One tenant's load (a process of its own): Poisson arrivals until `until` (time.monotonic()); then, with
    `finish`, every request runs to its end, else they are cancelled once `stop` is set. Puts (tenant, outcomes) on
    `queue`: per request its status, first-token time, token times (time.monotonic()) and whether it finished."""
    async def run() -> list[dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            tasks = await arrivals(session, url, f"{tenant}-key", rate, until, random.Random(tenant))
            if finish:
                await asyncio.gather(*tasks, return_exceptions=True)
            else:
                while not stop.is_set() and not all(t.done() for t in tasks):
                    await asyncio.sleep(0.1)
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            return [r if isinstance(r, dict) else {"status": 200, "times": [], "finished": False} for r in outcomes]
    queue.put((tenant, asyncio.run(run())))


def phase(name: str, policy: str, rates: dict[str, float], keys_file: str, args, finish: str | None,
          extra: tuple[str, ...] = ()) -> dict:
    """One server (`extra`: more `serve` flags), the tenants' arrivals for `args.seconds`; then `finish`'s requests
    run to their end and the rest are cancelled (aborted on the server). Per tenant: its finished requests and its
    output tokens in the window."""
    server = start(policy, keys_file, args, args.port, extra)
    url = f"http://127.0.0.1:{args.port}"

    def load() -> dict:
        """Each tenant's client in its own process, as tenants are apart in life: in one event loop, A's hundreds
        of streams delayed the reading of B's first token by seconds."""
        context = multiprocessing.get_context("spawn")
        until = time.monotonic() + args.seconds
        stop, queue = context.Event(), context.Queue()
        clients = {tenant: context.Process(target=tenant_client, args=(url, tenant, rate, until, finish == tenant,
                                                                       stop, queue))
                   for tenant, rate in rates.items()}
        for client in clients.values():
            client.start()
        outcomes = {}
        while len(outcomes) < len(clients):
            tenant, outcome = queue.get()
            outcomes[tenant] = outcome
            if tenant == finish or finish is None:
                stop.set()   # the others cancel what they have open
        for client in clients.values():
            client.join()
        refused = [r["status"] for group in outcomes.values() for r in group if r["status"] != 200]
        if refused:
            print(f"  refused: {len(refused)} requests, statuses {sorted(set(refused))}", flush=True)
        return {tenant: {"sent": len(outcomes[tenant]), "done": [r for r in outcomes[tenant] if r["finished"]],
                         "window_tokens": sum(sum(t < until for t in r["times"]) for r in outcomes[tenant])}
                for tenant in rates}
    try:
        results = load()
        server_p95 = server_ttft_p95(httpx.get(url + "/metrics", timeout=30).text)
    finally:
        server.terminate()
        server.wait(timeout=60)
    row = [f"{name:<32}"]
    for tenant, result in results.items():
        ttft = [r["ttft"] * 1e3 for r in result["done"]]
        row.append(f"{tenant}: {len(result['done']):>3} of {result['sent']:<3} done, TTFT P50 "
                   f"{quantile(ttft, 0.5):6.0f} P95 {quantile(ttft, 0.95):6.0f} ms "
                   f"(server {server_p95.get(tenant, float('nan')):6.0f}), "
                   f"{result['window_tokens'] / args.seconds:6.1f} tok/s")
    print("  ".join(row), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--rate-b", type=float, default=0.5, help="B's requests per second")
    parser.add_argument("--flood", type=float, default=10, help="A's rate over B's")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--phases", default=",".join(PHASES), help="which phases to run, of " + ", ".join(PHASES))
    args = parser.parse_args()
    phases = args.phases.split(",")
    if not phases or set(phases) - set(PHASES):
        parser.error(f"--phases: expected a comma-separated list of {', '.join(PHASES)}, got {args.phases!r}")
    rate_a = args.rate_b * args.flood
    print(f"machine: {describe()}; model: the CPU demo model; running set {args.max_num_seqs}; B {args.rate_b} "
          f"req/s, A {rate_a} req/s; prompts 150-250 words, 64 tokens out; {args.seconds:.0f} s a phase")
    both = {"A": rate_a, "B": args.rate_b}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        equal, weighted, ranked = Path(tmp) / "equal", Path(tmp) / "weighted", Path(tmp) / "ranked"
        equal.write_text("A-key tenant=A\nB-key tenant=B\n")
        weighted.write_text("A-key tenant=A weight=3\nB-key tenant=B weight=1\n")
        ranked.write_text("A-key tenant=A priority=1\nB-key tenant=B priority=0\n")
        runs = {
            "solo": [("solo", "B alone (fcfs)", "fcfs", {"B": args.rate_b}, equal, "B", ())],
            "fcfs": [("fcfs", "B under A's flood, fcfs", "fcfs", both, equal, "B", ())],
            "fair": [("fair", "B under A's flood, fair", "fair", both, equal, "B", ())],
            "weighted": [("weighted", "both flood, fair, weights 3:1", "fair", {"A": rate_a, "B": rate_a}, weighted,
                          None, ())],
            "priority": [("preempting", "B above A, fair, preemption", "fair", both, ranked, "B", ()),
                         ("waiting", "B above A, fair, no preemption", "fair", both, ranked, "B",
                          ("--no-priority-preemption",))],
        }
        for key in phases:
            for name, title, policy, rates, keys, finish, extra in runs[key]:
                results[name] = phase(title, policy, rates, str(keys), args, finish, extra)
    p95 = {name: quantile([r["ttft"] for r in result["B"]["done"]], 0.95)
           for name, result in results.items() if name != "weighted"}
    summary = {"b_ttft_p95_s": p95}
    if "solo" in p95:
        print("B's TTFT P95 over its solo P95: " + ", ".join(
            f"{name} {value / p95['solo']:.2f}x" for name, value in p95.items() if name != "solo")
            + " (goal for fair: <= 1.5x)")
    if "weighted" in results:
        tokens = summary["weighted_window_tokens"] = {t: r["window_tokens"] for t, r in results["weighted"].items()}
        print(f"weighted share A:B = {tokens['A'] / max(1, tokens['B']):.2f} (target 3.00)")
    if "preempting" in p95:
        print(f"high-priority B's TTFT P95 under A's flood: {p95['preempting'] * 1e3:.0f} ms with priority "
              f"preemption, {p95['waiting'] * 1e3:.0f} ms without")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
