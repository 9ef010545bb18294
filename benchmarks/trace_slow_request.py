"""A slow request found by its trace (docs/tracing.md's worked example): a router and a replica sending their spans
to an OTLP receiver in this process, a load that fills the replica's running batch, and one probe request sent into
it with its own `traceparent`; then the probe's trace as a tree, each span's duration, and the stage that took the
time named.

    python -P benchmarks/trace_slow_request.py [--shape smollm2-135m | --model smollm2-135m-instruct]
                                               [--max-num-seqs 4] [--load 12]

Everything runs on 127.0.0.1 and stops by itself. `--max-num-seqs` caps the replica's running batch so the load's
requests (long outputs, sent first) hold it and the probe waits in the engine's queue.
"""
import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from shapes import CPU_SHAPES, SHAPES, model_folder  # noqa: E402
from support.otlp_receiver import OtlpReceiver  # noqa: E402


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "--log-level", "WARNING", *command],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_ok(url: str, process: subprocess.Popen, log: Path) -> None:
    while True:
        if process.poll() is not None:
            sys.exit(f"{url} exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def tree(spans, root, origin_ns: int, depth: int = 0) -> list[str]:
    """The spans under `root`, indented, in start order: name, service, start (ms after `origin_ns`), duration."""
    lines = [f"{'  ' * depth}{root.name:<34} {root.service:<17} +{(root.start_ns - origin_ns) / 1e6:8.1f} ms "
             f"{(root.end_ns - root.start_ns) / 1e6:9.1f} ms"]
    for child in sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_ns):
        lines += tree(spans, child, origin_ns, depth + 1)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default=CPU_SHAPES[0])
    parser.add_argument("--model", help="a model folder or name (smollm2-135m-instruct) instead of --shape")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--load", type=int, default=12, help="requests sent before the probe")
    parser.add_argument("--load-tokens", type=int, default=96, help="output tokens of each load request")
    args = parser.parse_args()
    receiver = OtlpReceiver()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KUBEINFER_"))}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with tempfile.TemporaryDirectory() as tmp:
        folder, load_format = model_folder(Path(tmp), args.shape, args.model)
        replica_port, router_port = 18131, 18132
        replica_url, router_url = f"http://127.0.0.1:{replica_port}", f"http://127.0.0.1:{router_port}"
        replica = start(["serve", "--model", str(folder), "--load-format", load_format, "--served-model-name", "m",
                         "--host", "127.0.0.1", "--port", str(replica_port), "--max-num-seqs", str(args.max_num_seqs)],
                        env, Path(tmp) / "replica.log")
        router = start(["router", "--upstream", replica_url, "--host", "127.0.0.1", "--port", str(router_port)],
                       env, Path(tmp) / "router.log")
        try:
            wait_ok(replica_url + "/ready", replica, Path(tmp) / "replica.log")
            wait_ok(router_url + "/ready", router, Path(tmp) / "router.log")
            body = {"model": "m", "prompt": "Kubernetes schedules pods onto nodes", "max_tokens": args.load_tokens,
                    "temperature": 0, "ignore_eos": True}
            load = [threading.Thread(target=httpx.post, args=(router_url + "/v1/completions",),
                                     kwargs={"json": body, "timeout": 600}) for _ in range(args.load)]
            for thread in load:
                thread.start()
            time.sleep(0.5)   # the load reaches the replica first
            trace_id = secrets.token_hex(16)
            probe = {"model": "m", "messages": [{"role": "user", "content": "Why was I slow?"}], "max_tokens": 16,
                     "temperature": 0, "ignore_eos": True}
            started = time.monotonic()
            answer = httpx.post(router_url + "/v1/chat/completions", json=probe, timeout=600,
                                headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
            took = time.monotonic() - started
            for thread in load:
                thread.join()
        finally:
            router.terminate()
            replica.terminate()
            router.wait(60)
            replica.wait(60)
    receiver.stop()
    spans = receiver.spans_of(trace_id)
    [root] = [s for s in spans if s.service == "kubeinfer-router" and s.name.startswith("POST /v1/")]
    print(f"probe: HTTP {answer.status_code} in {took * 1e3:.0f} ms, trace {trace_id}, {len(spans)} spans; the load: "
          f"{args.load} requests of {args.load_tokens} tokens on a replica running {args.max_num_seqs} at a time")
    print("\n".join(tree(spans, root, root.start_ns)))
    stages = [s for s in spans if s.name in ("admission", "pick", "queue", "prefill", "decode")]
    slowest = max(stages, key=lambda s: s.end_ns - s.start_ns)
    share = (slowest.end_ns - slowest.start_ns) / (root.end_ns - root.start_ns)
    print(f"slowest stage: {slowest.name} ({slowest.service}), {share:.0%} of the request's time at the router")


if __name__ == "__main__":
    main()
