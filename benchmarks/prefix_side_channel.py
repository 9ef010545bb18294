"""The prefix cache's timing side channel, measured: can one tenant tell from its time to first token whether
another tenant sent a given prompt?

Starts `kubeinfer serve` (the trained SmolLM2-135M-Instruct by default) with two API keys, victim and attacker,
once per `--prefix-cache-sharing` mode. The victim sends `--probes` secret prompts (each ~`--words` words, a
distinct random "document" behind a common instruction). Then the attacker probes, alternating, each secret once
and as many fresh prompts of the same shape that nobody sent, streamed, max_tokens 1, and times the first token.
Prints per mode the TTFT medians of both kinds, the cached tokens the server reported, and the attacker's best
guess rate: the AUC (the chance that a sent prompt's probe is faster than a fresh one's; 0.5: cannot tell,
1.0: always tells).

    python -P benchmarks/prefix_side_channel.py [--probes 30] [--words 300] [--model DIR]
"""
import argparse
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

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from peers.machine import describe   # noqa: E402

from kubeinfer.runtime.trained_models import smollm2_dir  # noqa: E402

INSTRUCTION = "Summarize the following internal document in one sentence.\n\n"
WORDS = ("quarterly revenue forecast pipeline customer churn merger contract salary audit roadmap incident "
         "outage credential migration budget hiring layoff patent lawsuit supplier invoice").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def document(rng: random.Random, words: int) -> str:
    return INSTRUCTION + " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


def start(model: str, keys: Path, sharing: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING", "serve", "--model",
               model, "--host", "127.0.0.1", "--port", str(port), "--api-keys-file", str(keys),
               "--prefix-cache-sharing", sharing, "--max-model-len", "2048"]
    server = subprocess.Popen(command, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600   # the model's load on a busy box
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    server.kill()
    sys.exit("the server did not become ready")


def ttft(client: httpx.Client, key: str, prompt: str) -> tuple[float, int]:
    """(seconds to the first token's chunk, cached prompt tokens) of one streamed completion."""
    body = {"model": client.model_name, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    started, first, cached = time.perf_counter(), None, -1
    with client.stream("POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first, cached


def auc(sent: list[float], fresh: list[float]) -> float:
    """P(a sent prompt's probe is faster than a fresh one's), ties counting half (the Mann-Whitney statistic)."""
    wins = sum((s < f) + 0.5 * (s == f) for s in sent for f in fresh)
    return wins / (len(sent) * len(fresh))


def measure(model: str, keys: Path, sharing: str, probes: int, words: int, seed: int) -> dict:
    rng = random.Random(seed)
    secrets = [document(rng, words) for _ in range(probes)]
    fresh = [document(rng, words) for _ in range(probes)]
    server, url = start(model, keys, sharing)
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            served = client.get("/v1/models", headers={"Authorization": "Bearer victim-key"}).json()
            client.model_name = served["data"][0]["id"]
            for prompt in secrets[:2]:   # warm-up: first requests pay one-off costs
                ttft(client, "attacker-key", "warm-up " + prompt)
            for prompt in secrets:
                ttft(client, "victim-key", prompt)
            sent_times, fresh_times, sent_cached, fresh_cached = [], [], [], []
            for secret, other in zip(secrets, fresh):
                for prompt, times, cached in ((secret, sent_times, sent_cached), (other, fresh_times, fresh_cached)):
                    seconds, tokens = ttft(client, "attacker-key", prompt)
                    times.append(seconds)
                    cached.append(tokens)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return {"sharing": sharing, "sent_ms": statistics.median(sent_times) * 1e3,
            "fresh_ms": statistics.median(fresh_times) * 1e3, "sent_cached": statistics.mean(sent_cached),
            "fresh_cached": statistics.mean(fresh_cached), "auc": auc(sent_times, fresh_times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", type=int, default=30)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--model", default=None, help="model folder [default: the trained SmolLM2-135M-Instruct]")
    parser.add_argument("--modes", default="tenant,shared")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = args.model or str(smollm2_dir())
    print(describe())
    print(f"model {model}; {args.probes} secret and {args.probes} fresh prompts of ~{args.words} words")
    print(f"{'sharing':<9}{'sent TTFT ms':>14}{'fresh TTFT ms':>15}{'sent cached':>13}{'fresh cached':>14}{'AUC':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys"
        keys.write_text("victim-key tenant=victim\nattacker-key tenant=attacker\n")
        for sharing in args.modes.split(","):
            r = measure(model, keys, sharing, args.probes, args.words, args.seed)
            print(f"{r['sharing']:<9}{r['sent_ms']:>14.1f}{r['fresh_ms']:>15.1f}{r['sent_cached']:>13.0f}"
                  f"{r['fresh_cached']:>14.0f}{r['auc']:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
