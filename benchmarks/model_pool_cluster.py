"""The model pool's yardstick on the real cluster (issue #51, part 4): one multi-model trace served three ways on the
node, then the same requests in the simulator (operator/autoscaling/simulator/multi_model.py), side by side.

    python -P benchmarks/model_pool_cluster.py --kubeconfig K --image IMG [--models 4] [--requests 200]
        [--seconds 240] [--awake 1] [--idle 30] [--layouts always_on scale_to_zero pool] [--seed 0]

- `always_on`: one InferenceService per model, one replica each, served through its Service.
- `scale_to_zero`: one InferenceService per model at `minReplicas: 0` with the operator's router (which holds a
  request while its model has no replica; the autoscaler starts one), back to zero `--idle` seconds after its last
  request.
- `pool`: one InferenceService with `spec.modelPool`: one pod runs every model (`kubeinfer pool`), at most
  `--awake` of them awake; its router wakes the one a request needs.

Every layout's pods get the same resources (one "GPU" here is one replica pod of `--cpu` cores). The trace: the real
bursty conversation trace (benchmarks/autoscale/traces/bursty_conversation.csv) compressed onto `--seconds`, each
model's arrivals thinned to its Zipf share of `--requests` from its own start point (`multi_model_trace`, as in
benchmarks/model_pool_trace.py), prompts and outputs clipped to what the CPU demo model serves. The models are the
demo Llama under `--models` names (each engine loads its own copy). Billed: engine pods (created, not yet gone),
sampled every second, over the same window for each layout (the load's start to its last answer's end).

Simulated: the same requests (their real prompt and output token counts) in `MultiModelSim` with the calibrated CPU
demo replica, the swap the pool's router measured (`kubeinfer_router_pool_wake_seconds`, mean) and the cold start the
scale-to-zero run showed (a model's first request to its pod Ready, median). Traffic goes only to this cluster's
Services; the load stops by itself. The operator runs on this machine, as in benchmarks/burst_real_vs_sim.py.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import httpx
from kubernetes import client, config as kube_config
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))
from burst_real_vs_sim import GROUP, PLURAL, VERSION, connect_timer, is_ready, one_request, prompt_of  # noqa: E402
from serve import quantile  # noqa: E402
from peers.on_kill import exit_on_sigterm  # noqa: E402

from kubeinfer.operator.autoscaling.simulator.multi_model import (  # noqa: E402
    MultiModelSim, Request, multi_model_trace,
)
from kubeinfer.operator.autoscaling.simulator.sim import CPU_DEMO_MODEL  # noqa: E402
from kubeinfer.operator.autoscaling.simulator.trace_file import read_requests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "benchmarks" / "autoscale" / "traces" / "bursty_conversation.csv"
NAMESPACE = "kubeinfer-pool-bench"
ENGINE_PODS = "kubeinfer.dev/inferenceservice"   # the replicas' label (router pods carry kubeinfer.dev/router)
MAX_NUM_SEQS = 8
LAYOUTS = ("always_on", "scale_to_zero", "pool")


def model_name(i: int) -> str:
    return f"m{i}"


def inference_services(layout: str, args) -> list[dict]:
    """The InferenceServices of one layout."""
    runtime = {"image": args.image, "imagePullPolicy": "Never", "maxModelLen": 1024, "maxNumSeqs": MAX_NUM_SEQS,
               "kvCacheMemoryGib": 0.25}
    demo = {"uri": "file:///opt/kubeinfer/models/demo"}

    def service(name: str, memory: str, **spec) -> dict:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": name},
                "spec": {"model": demo, "runtime": runtime, "resources": {"gpus": 0, "cpu": args.cpu, "memory": memory},
                         **spec}}
    names = [model_name(i) for i in range(args.models)]
    if layout == "always_on":
        return [service(name, "2Gi", replicas=1) for name in names]
    if layout == "scale_to_zero":
        autoscaling = {"minReplicas": 0, "maxReplicas": 1, "metricWindowSeconds": 5, "initialDelaySeconds": 0,
                       "scaleToZeroIdleSeconds": args.idle, "scaleDownStabilizationSeconds": 0}
        return [service(name, "2Gi", replicas=0, router={"queueTimeoutSeconds": 300}, autoscaling=autoscaling)
                for name in names]
    pool = {"models": [{"servedName": name, **demo} for name in names[1:]], "maxAwake": args.awake, "sleepLevel": 1}
    return [service(names[0], f"{1 + args.models}Gi", replicas=1, router={"queueTimeoutSeconds": 300},
                    modelPool=pool)]


def service_of(layout: str, model: str) -> str:
    """The Service a request for `model` goes to."""
    return {"always_on": model, "scale_to_zero": f"{model}-router", "pool": f"{model_name(0)}-router"}[layout]


def workload(args) -> list[Request]:
    """The multi-model trace, compressed onto `args.seconds` (arrival, model, prompt and output tokens)."""
    base = read_requests(TRACE)
    factor = args.seconds / max(base[-1][0], 1.0)
    compressed = [(t * factor, min(p, args.max_prompt_tokens), min(o, args.max_output_tokens)) for t, p, o in base]
    return multi_model_trace(compressed, args.models, args.zipf, args.requests / args.seconds * 3600, args.seed)


def engine_pods(core) -> list:
    return [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=ENGINE_PODS).items
            if not p.metadata.deletion_timestamp]


def every_engine_up(pod, models: int) -> bool:
    """A pool pod's engines all answer (model i on port 8000 + i): the pod is Ready once the first one is, and
    `kubeinfer pool` starts them one after the other."""
    try:
        return all(httpx.get(f"http://{pod.status.pod_ip}:{8000 + i}/health", timeout=5).status_code == 200
                   for i in range(models))
    except httpx.HTTPError:
        return False


def wait_serving(core, layout: str, args) -> dict[str, str]:
    """Waits until every model answers /v1/models at its Service; returns the model -> base URL map."""
    deadline = time.monotonic() + 300
    urls: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            for i in range(args.models):
                name = model_name(i)
                svc = core.read_namespaced_service(service_of(layout, name), NAMESPACE)
                url = f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}/v1"
                listed = [m["id"] for m in httpx.get(url + "/models", timeout=5).json()["data"]]
                if name not in listed:
                    raise LookupError(name)
                urls[name] = url
            ready = [p for p in engine_pods(core) if is_ready(p)]
            if layout == "scale_to_zero" or (layout == "always_on" and len(ready) == args.models) or (
                    layout == "pool" and ready and every_engine_up(ready[0], args.models)):
                return urls
        except (ApiException, httpx.HTTPError, LookupError, KeyError, ValueError):
            pass
        time.sleep(1.0)
    raise SystemExit(f"{layout}: not every model served in 300 s; see /tmp/pool-bench-operator.log")


async def warm(session: aiohttp.ClientSession, urls: set[str], connections: int) -> None:
    """Opens `connections` keep-alive connections to each URL before the load (concurrent GETs of /models): on
    this node the first request on a new connection through a ClusterIP is late by seconds (TCP retransmissions;
    docs/benchmarks/autoscaling.md, the Azure replays), which is the node's network, not the layout."""
    async def get(url: str) -> None:
        async with session.get(url + "/models", trace_request_ctx={}) as response:
            await response.read()
    await asyncio.gather(*(get(url) for url in urls for _ in range(connections)))


async def replay(urls: dict[str, str], requests: list[Request], prompts: list[str], core,
                 warm_connections: int) -> tuple[list[dict], dict]:
    """Sends every request at its arrival; samples the engine pods every second. Returns the records and the pods
    seen: uid -> {model, created, ready, gone} in seconds since the load started."""
    records = [{"arrival": r.arrival, "model": model_name(r.model), "max_tokens": r.output} for r in requests]
    pods: dict[str, dict] = {}
    started = wall = 0.0

    async def sample() -> None:
        while True:
            now = time.monotonic() - started
            listed = await asyncio.to_thread(engine_pods, core)
            for pod in listed:
                seen = pods.setdefault(pod.metadata.uid, {
                    "model": pod.metadata.labels[ENGINE_PODS],
                    "created": pod.metadata.creation_timestamp.timestamp() - wall, "ready": None, "gone": None})
                if seen["ready"] is None and is_ready(pod):
                    ready = next(c for c in pod.status.conditions if c.type == "Ready")
                    seen["ready"] = ready.last_transition_time.timestamp() - wall
            for uid, seen in pods.items():
                if seen["gone"] is None and uid not in {p.metadata.uid for p in listed}:
                    seen["gone"] = now
            await asyncio.sleep(1.0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=600),
                                     trace_configs=[connect_timer()],
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        await warm(session, set(urls.values()), warm_connections)
        started, wall = time.monotonic(), time.time()
        sampler = asyncio.create_task(sample())
        tasks = []
        for record, prompt in zip(records, prompts):
            await asyncio.sleep(max(0.0, started + record["arrival"] - time.monotonic()))
            tasks.append(asyncio.create_task(timed(session, urls[record["model"]], record, prompt, started)))
        await asyncio.gather(*tasks)
        await asyncio.sleep(1.5)
        sampler.cancel()
    return records, pods


async def timed(session, url: str, record: dict, prompt: str, started: float) -> None:
    await one_request(session, url, prompt, record["max_tokens"], record, model=record["model"])
    record["end"] = time.monotonic() - started


def billed_seconds(pods: dict, end: float) -> float:
    """Engine pod-seconds within [0, end]: each pod from its creation to its going (or the end)."""
    return sum(max(0.0, min(p["gone"] if p["gone"] is not None else end, end) - max(p["created"], 0.0))
               for p in pods.values())


def cold_starts(pods: dict, records: list[dict]) -> list[float]:
    """Per pod created during the load: its model's first request since the pod before it went, to Ready."""
    out = []
    for pod in pods.values():
        if pod["created"] <= 0 or pod["ready"] is None:
            continue
        before = [p["gone"] for p in pods.values() if p["model"] == pod["model"] and p["gone"] is not None
                  and p["gone"] <= pod["created"]]
        since = max(before, default=0.0)
        asked = [r["arrival"] for r in records
                 if r["model"] == pod["model"] and since <= r["arrival"] <= pod["created"]]
        if asked:
            out.append(pod["ready"] - min(asked))
    return out


def router_wakes(core) -> tuple[float | None, int]:
    """The pool router's wakes (`kubeinfer_router_pool_wake_seconds` over its pods): mean seconds (None: no wake
    seen) and how many."""
    total = count = 0.0
    for pod in core.list_namespaced_pod(NAMESPACE, label_selector="kubeinfer.dev/router").items:
        port = pod.spec.containers[0].ports[0].container_port
        for line in httpx.get(f"http://{pod.status.pod_ip}:{port}/metrics", timeout=5).text.splitlines():
            if line.startswith("kubeinfer_router_pool_wake_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("kubeinfer_router_pool_wake_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
    return (total / count if count else None), int(count)


def run_layout(layout: str, args, requests: list[Request], prompts: list[str], core, custom) -> dict:
    for body in inference_services(layout, args):
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    try:
        urls = wait_serving(core, layout, args)
        if layout == "scale_to_zero":   # the load starts with every model at zero
            deadline = time.monotonic() + 120
            while engine_pods(core) and time.monotonic() < deadline:
                time.sleep(1.0)
        print(f"{layout}: serving; replaying {len(requests)} requests over {args.seconds:.0f} s", flush=True)
        records, pods = asyncio.run(replay(urls, requests, prompts, core, args.warm_connections))
        wake, wakes = router_wakes(core) if layout == "pool" else (None, 0)
    finally:
        for body in inference_services(layout, args):
            try:
                custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body["metadata"]["name"])
            except ApiException:
                pass
        deadline = time.monotonic() + 120
        while core.list_namespaced_pod(NAMESPACE).items and time.monotonic() < deadline:
            time.sleep(1.0)
    return {"records": records, "pods": pods, "wake": wake, "wakes": wakes}


def p50_p95(values: list[float]) -> str:
    return f"{quantile(values, 0.5):.3f} / {quantile(values, 0.95):.3f}" if values else "– / –"


def report(args, requests: list[Request], runs: dict[str, dict]) -> None:
    served = {layout: [r for r in run["records"] if "ttft" in r] for layout, run in runs.items()}
    end = max(r["end"] for run in runs.values() for r in run["records"] if "end" in r)
    starts = cold_starts(runs["scale_to_zero"]["pods"], runs["scale_to_zero"]["records"]) \
        if "scale_to_zero" in runs else []
    cold = statistics.median(starts) if starts else args.cold_start
    swap = (runs.get("pool") or {}).get("wake") or args.swap
    print(f"\n{args.models} models (Zipf {args.zipf}), {len(requests)} requests over {args.seconds:.0f} s, "
          f"{args.awake} awake in the pool, idle {args.idle} s; every layout billed over [0, {end:.0f}] s")
    print(f"measured: cold start (first request -> pod Ready, median of {len(starts)}) {cold:.1f} s; the pool "
          f"router's wake (mean) {swap:.3f} s")
    model = replace(CPU_DEMO_MODEL, max_batch=MAX_NUM_SEQS)
    print("\n| layout | real pod-hours | vs (a) | real TTFT P50 / P95 s | P95 vs (a) | errors | connections opened "
          "during the load | their requests' TTFT P50 / P95 s | swaps or cold starts | sim pod-hours | sim TTFT P50 / "
          "P95 s | sim swaps or cold starts |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base_hours = base_p95 = None
    for layout, run in runs.items():
        ttfts = [r["ttft"] for r in served[layout]]
        opened = [r["ttft"] for r in served[layout] if "connect_s" in r]
        switches = run["wakes"] if layout == "pool" else sum(p["created"] > 0 for p in run["pods"].values())
        hours = billed_seconds(run["pods"], end) / 3600
        p95 = quantile(ttfts, 0.95) if ttfts else float("nan")
        if layout == "always_on":
            base_hours, base_p95 = hours, p95
        same = [Request(r["arrival"], int(r["model"][1:]), r.get("prompt_tokens", 1), r.get("output_tokens", 1))
                for r in run["records"]]
        sim = MultiModelSim(same, args.models, layout, model, pods=1, swap_s=swap, cold_start_s=cold,
                            idle_s=args.idle, awake_per_pod=args.awake).run()
        sim_hours = sim.billed_s / 3600   # over the simulation's own window (to its last answer)
        vs = (f"{hours / base_hours:.0%}", f"{p95 / base_p95:.2f}x") if base_hours else ("", "")
        print(f"| {layout} | {hours:.4f} | {vs[0]} | {p50_p95(ttfts)} | {vs[1]} | "
              f"{len(run['records']) - len(ttfts)} | {len(opened)} | {p50_p95(opened)} | {switches} | "
              f"{sim_hours:.4f} | {sim.ttft(0.5):.3f} / "
              f"{sim.ttft(0.95):.3f} | {sim.swaps + sim.cold_starts} |")


def main() -> None:
    exit_on_sigterm()   # `kill` stops what it started (the finally blocks, subprocess.run's child)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--requests", type=int, default=200, help="all models together, over --seconds")
    parser.add_argument("--seconds", type=float, default=240.0, help="the trace's span here")
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--awake", type=int, default=1, help="the pool's models awake at once (maxAwake)")
    parser.add_argument("--idle", type=int, default=30, help="scale_to_zero: scaleToZeroIdleSeconds")
    parser.add_argument("--cpu", default="250m", help="each replica pod's CPU request (the 'GPU' of this node); on "
                        "a 2-CPU node, 250m fits scale_to_zero's 4 routers (250m each) and 4 replicas at once")
    parser.add_argument("--max-prompt-tokens", type=int, default=200)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--cold-start", type=float, default=10.0, help="the simulator's, without a scale_to_zero run")
    parser.add_argument("--swap", type=float, default=0.24, help="the simulator's, without a pool run")
    parser.add_argument("--warm-connections", type=int, default=8, help="keep-alive connections opened to each "
                        "Service before the load")
    parser.add_argument("--out", help="write every request's record and the pods seen here (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.models < 2:
        parser.error("--models: at least 2 (a pool of one model is one always-on service)")
    requests = workload(args)
    from kubeinfer.runtime.demo import train_tokenizer
    tokenizer, rng = train_tokenizer(), random.Random(args.seed)
    prompts = [prompt_of(r.prompt, tokenizer, rng) for r in requests]
    kube_config.load_kube_config(args.kubeconfig)
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "apply", "--server-side", "--force-conflicts",
                    "-f", str(ROOT / "crds")], check=True, capture_output=True)
    subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "wait", "--for", "condition=Established",
                    "--timeout", "60s", f"crd/{PLURAL}.{GROUP}"], check=True, capture_output=True)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as error:
        if error.status != 409:
            raise
    env = {**os.environ, "KUBECONFIG": args.kubeconfig, "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "1"}
    log = open("/tmp/pool-bench-operator.log", "w")
    operator = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.operator", "-n", NAMESPACE], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd="/")
    try:
        runs = {layout: run_layout(layout, args, requests, prompts, core, custom) for layout in args.layouts}
    finally:
        operator.terminate()
        operator.wait(30)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}))
    report(args, requests, runs)


if __name__ == "__main__":
    main()
