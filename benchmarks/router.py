"""Cache-aware routing vs round-robin, measured: `kubeinfer router` in front of CPU demo-model replicas.

For each policy, starts N fresh replicas (`kubeinfer serve --model demo`, one torch thread each, a KV cache
small enough that one replica cannot hold every system prompt) and a router, then runs the same multi-turn chat
workload through it: S long system prompts x U users x T turns, each user's turns in order (a turn's messages
are the whole conversation so far), `--concurrency` conversations at a time. Reports, per policy: TTFT
(mean, P50, P95), the replicas' prefix-cache hit rate (`kubeinfer_prefix_cache_hits_total` /
`_queries_total`, in tokens), throughput, and each replica's share of the requests (max / mean). Then the
router's added latency at light load: one request at a time, P50 TTFT through the router vs straight to the
replica the router picked for it.

    python benchmarks/router.py [--replicas 3] [--systems 8] [--users 6] [--turns 3] [--concurrency 6]
                                [--kv-blocks 144] [--policies prefix round-robin]

The default workload is the issue's example, 8 system prompts x many users, multi-turn; the KV cache is sized
by one rule: the fleet can hold every system prompt (8 x 44 blocks), one replica about a third of them. How the
gain moves with that size, and a harder workload (16 x 3 x 3, 320 blocks), are in docs/benchmarks/serving-features.md,
"Router".
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

import aiohttp

WORDS = ("pod node GPU cache token replica scheduler batch queue model service ingress deployment namespace "
         "volume secret label selector taint toleration affinity quota limit request probe rollout").split()


def words(rng: random.Random, chars: int) -> str:
    text = []
    while sum(map(len, text)) + len(text) < chars:
        text.append(rng.choice(WORDS))
    return " ".join(text)


def conversations(args) -> list[tuple[str, list[str]]]:
    """(system prompt, the user's turns) per user: the same for every policy (fixed seed)."""
    rng = random.Random(args.seed)
    systems = [f"System {i}. " + words(rng, args.system_chars) for i in range(args.systems)]
    return [(system, [f"User {u}, turn {t}: " + words(rng, args.user_chars) for t in range(args.turns)])
            for system in systems for u in range(args.users)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def chat_turn(session: aiohttp.ClientSession, url: str, model: str, messages: list[dict],
                    max_tokens: int) -> tuple[float, str, str]:
    """(TTFT, the reply's text, the replica that served it), streamed."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "ignore_eos": True}
    started = time.perf_counter()
    ttft, text = None, []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        replica = response.headers.get("x-kubeinfer-replica", url)
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                ttft = ttft or time.perf_counter() - started
                text.append(delta)
    return ttft, "".join(text), replica


async def scrape_sum(session: aiohttp.ClientSession, url: str, names: tuple[str, ...]) -> dict[str, float]:
    sums = dict.fromkeys(names, 0.0)
    async with session.get(url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in sums:
                sums[name] += float(line.rsplit(" ", 1)[1])
    return sums


async def pick_reasons(session: aiohttp.ClientSession, router_url: str) -> dict[str, int]:
    """The router's picks by reason (`kubeinfer_router_picks_total`), summed over replicas."""
    reasons: dict[str, int] = {}
    async with session.get(router_url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith("kubeinfer_router_picks_total{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                reasons[reason] = reasons.get(reason, 0) + int(float(line.rsplit(" ", 1)[1]))
    return reasons


CACHE = ("kubeinfer_prefix_cache_hits_total", "kubeinfer_prefix_cache_queries_total",
         "kubeinfer_num_preemptions_total")


async def run_workload(args, router_url: str, replica_urls: list[str], model: str) -> dict:
    work = conversations(args)
    random.Random(args.seed + 1).shuffle(work)
    queue = iter(work)
    ttfts, served, tokens = [], [], 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        before = [await scrape_sum(session, url, CACHE) for url in replica_urls]

        async def user_loop():
            nonlocal tokens
            for system, turns in queue:
                messages = [{"role": "system", "content": system}]
                for turn in turns:
                    messages.append({"role": "user", "content": turn})
                    ttft, reply, replica = await chat_turn(session, router_url, model, messages, args.max_tokens)
                    messages.append({"role": "assistant", "content": reply})
                    ttfts.append(ttft)
                    served.append(replica)
                    tokens += args.max_tokens

        started = time.perf_counter()
        await asyncio.gather(*(user_loop() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - started
        after = [await scrape_sum(session, url, CACHE) for url in replica_urls]
        reasons = await pick_reasons(session, router_url)
    hits = sum(a[CACHE[0]] - b[CACHE[0]] for a, b in zip(after, before))
    queries = sum(a[CACHE[1]] - b[CACHE[1]] for a, b in zip(after, before))
    counts = [served.count(url) for url in replica_urls]
    preemptions = sum(a[CACHE[2]] - b[CACHE[2]] for a, b in zip(after, before))
    return {"reasons": reasons, "preemptions": preemptions, "requests": len(ttfts), "ttft_mean": statistics.mean(ttfts),
            "ttft_p50": percentile(ttfts, 0.5),
            "ttft_p95": percentile(ttfts, 0.95), "hit_rate": hits / queries if queries else 0.0,
            "rps": len(ttfts) / elapsed, "tokens_per_s": tokens / elapsed, "elapsed": elapsed, "counts": counts,
            "max_over_mean": max(counts) / statistics.mean(counts)}


async def light_load(args, router_url: str, model: str) -> dict:
    """One request at a time, alternating: through the router, then straight to the replica it picked. On a
    shared machine the P50s drift with other load; the median of each pair's difference drifts less."""
    prompt = [{"role": "user", "content": "What is a pod?"}]
    through, direct = [], []
    async with aiohttp.ClientSession() as session:
        replica = (await chat_turn(session, router_url, model, prompt, 1))[2]
        await chat_turn(session, replica, model, prompt, 1)   # warm both connections
        for _ in range(args.light_requests):
            through.append((await chat_turn(session, router_url, model, prompt, 1))[0])
            direct.append((await chat_turn(session, replica, model, prompt, 1))[0])
    return {"router_p50": percentile(through, 0.5), "direct_p50": percentile(direct, 0.5),
            "added_p50": statistics.median(a - b for a, b in zip(through, direct))}


def kubeinfer(*args: str, log) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING", *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


async def wait_ready(url: str, proc: subprocess.Popen, path: str = "/ready") -> None:
    deadline = time.monotonic() + 180
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                async with session.get(url + path) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    sys.exit(f"{url} did not become ready (exit code {proc.poll()}; logs in {os.environ.get('ROUTER_BENCH_LOGS')})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_policy(args, policy: str, log_dir: str) -> tuple[dict, dict | None]:
    ports = [free_port() for _ in range(args.replicas)]
    replica_urls = [f"http://127.0.0.1:{port}" for port in ports]
    router_port = free_port()
    router_url = f"http://127.0.0.1:{router_port}"
    log = open(os.path.join(log_dir, f"{policy}.log"), "w")
    procs = [kubeinfer("serve", "--model", "demo", "--host", "127.0.0.1", "--port", str(port), "--cpu-threads", "1",
                       "--num-kvcache-blocks", str(args.kv_blocks), "--max-model-len", "2048",
                       *args.replica_args.split(), log=log)
             for port in ports]
    upstreams = [arg for url in replica_urls for arg in ("--upstream", url)]
    procs.append(kubeinfer("router", *upstreams, "--host", "127.0.0.1", "--port", str(router_port),
                           "--policy", policy, *args.router_args.split(), log=log))
    try:
        async def go():
            for url, proc in zip(replica_urls, procs):
                await wait_ready(url, proc)
            await wait_ready(router_url, procs[-1], "/health")
            await asyncio.sleep(0.5)   # the router's first scrapes
            async with aiohttp.ClientSession() as session:
                async with session.get(replica_urls[0] + "/v1/models") as response:
                    model = (await response.json())["data"][0]["id"]
            result = await run_workload(args, router_url, replica_urls, model)
            light = (await light_load(args, router_url, model)
                     if policy == args.policies[0] and args.light_requests else None)
            return result, light
        return asyncio.run(go())
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--systems", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--users", type=int, default=6, help="users (conversations) per system prompt")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--system-chars", type=int, default=1200, help="characters per system prompt")
    parser.add_argument("--user-chars", type=int, default=120, help="characters per user message")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--concurrency", type=int, default=6, help="conversations in flight")
    parser.add_argument("--kv-blocks", type=int, default=144, help="KV cache blocks (16 tokens) per replica")
    parser.add_argument("--light-requests", type=int, default=100, help="requests of the light-load comparison")
    parser.add_argument("--policies", nargs="+", default=["prefix", "round-robin"])
    parser.add_argument("--router-args", default="", help="more router flags, e.g. '--footprint-weight 0'")
    parser.add_argument("--replica-args", default="", help="more `kubeinfer serve` flags for every replica")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    log_dir = tempfile.mkdtemp(prefix="router-bench-")
    os.environ["ROUTER_BENCH_LOGS"] = log_dir
    print(f"{args.replicas} replicas of the demo model (1 torch thread, {args.kv_blocks} KV blocks each) on "
          f"{os.cpu_count()} CPUs; {args.systems} system prompts x {args.users} users x {args.turns} turns, "
          f"{args.concurrency} conversations at a time, {args.max_tokens} tokens per reply; router flags "
          f"{args.router_args or '(defaults)'}; replica flags {args.replica_args or '(defaults)'}; logs in {log_dir}")
    results, light = {}, None
    for policy in args.policies:
        results[policy], measured = run_policy(args, policy, log_dir)
        light = light or measured
    print(f"\n{'policy':<13}{'reqs':>5} {'TTFT mean':>10} {'P50':>8} {'P95':>8} {'hit rate':>9} {'req/s':>7} "
          f"{'tok/s':>7} {'preempt':>7}  requests per replica (max/mean), picks by reason")
    for policy, r in results.items():
        print(f"{policy:<13}{r['requests']:>5} {r['ttft_mean'] * 1e3:>8.0f}ms {r['ttft_p50'] * 1e3:>6.0f}ms "
              f"{r['ttft_p95'] * 1e3:>6.0f}ms {r['hit_rate']:>9.1%} {r['rps']:>7.2f} {r['tokens_per_s']:>7.1f} "
              f"{r['preemptions']:>7.0f}  "
              f"{r['counts']} ({r['max_over_mean']:.2f}), "
              + " ".join(f"{reason} {n}" for reason, n in sorted(r["reasons"].items())))
    if "prefix" in results and "round-robin" in results:
        p, rr = results["prefix"], results["round-robin"]
        print(f"prefix vs round-robin: mean TTFT {rr['ttft_mean'] / p['ttft_mean']:.2f}x lower, hit rate "
              f"{p['hit_rate'] / max(rr['hit_rate'], 1e-9):.2f}x higher, throughput {p['rps'] / rr['rps']:.2f}x")
    if light:
        print(f"light load, one request at a time ({args.light_requests} each): TTFT P50 through the router "
              f"{light['router_p50'] * 1e3:.2f} ms, direct {light['direct_p50'] * 1e3:.2f} ms; added: "
              f"{(light['router_p50'] - light['direct_p50']) * 1e3:.2f} ms (difference of the P50s), "
              f"{light['added_p50'] * 1e3:.2f} ms (median of the paired differences)")


if __name__ == "__main__":
    main()
