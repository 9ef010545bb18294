"""One burst (or a replayed trace file) on a real cluster, then the same requests in the autoscaling simulator:
replicas and TTFT over time, side by side.

    python benchmarks/burst_real_vs_sim.py --kubeconfig K --image IMG [--base-rate 1 --burst-rate 8
        --phase-seconds 40] [--plot docs/burst-real-vs-sim.png]
    python benchmarks/burst_real_vs_sim.py --kubeconfig K --image IMG --trace-file benchmarks/autoscale/traces/X.csv
        [--compress-to 180 --rate-scale 1 --max-prompt-tokens 300 --max-output-tokens 48] [--policy predictive]

With `--trace-file` the arrivals are the file's (`TIMESTAMP,ContextTokens,GeneratedTokens`, compressed and scaled
as in benchmarks/autoscale_sweep.py), each request with its own prompt and output length (clipped to what the CPU
demo model serves; prompts are built from words up to the token count). `--policy predictive` runs the operator's
predictive policy (`spec.autoscaling.policy`) on the cluster and the same policy in the simulator.

Real: `kubeinfer operator` on this machine (direct scrape of the pods' /metrics, its default), an
autoscaled CPU InferenceService of the demo model in the namespace `kubeinfer-burst-bench`, and Poisson
arrivals through its Service: base rate, burst rate, base rate, one phase each. Every request's arrival,
prompt tokens, output tokens and TTFT are recorded, and spec.replicas / ready pods every second.
Simulated: the same arrivals and lengths, the simulator's CPU demo-model replica (calibrated by
benchmarks/autoscale/calibrate.py) with the cold start the real pods showed (creation -> Ready, median), the
same autoscaling settings, and our policy at the operator's 5 s interval. Traffic goes only to this
cluster's Service; the load stops by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
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
from kubeinfer.operator.autoscaling.simulator.policies import KubeInferPolicy, OperatorPredictivePolicy  # noqa: E402
from kubeinfer.operator.autoscaling.simulator.sim import CPU_DEMO_MODEL, Request, Simulation, Trace  # noqa: E402
from kubeinfer.operator.autoscaling.simulator.trace_file import load_trace  # noqa: E402
from serve import histogram_sums  # noqa: E402
from peers.on_kill import exit_on_sigterm  # noqa: E402

from kubeinfer.operator.autoscaling.policies.types import PolicyConfig  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE, NAME = "kubeinfer-burst-bench", "burst"
GROUP, VERSION, PLURAL = "kubeinfer.dev", "v1alpha1", "inferenceservices"
MAX_NUM_SEQS = 4
AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2, "targetQueueDepthPerReplica": 2, "targetTTFTP95Seconds": 1.0,
               "metricWindowSeconds": 10, "scaleDownStabilizationSeconds": 20, "initialDelaySeconds": 0}


def inference_service(image: str, autoscaling: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": NAME},
            "spec": {"model": {"uri": "file:///opt/kubeinfer/models/demo"},
                     "runtime": {"image": image, "imagePullPolicy": "Never", "maxModelLen": 1024,
                                 "maxNumSeqs": MAX_NUM_SEQS},
                     "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
                     "autoscaling": autoscaling}}


def autoscaling_of(args) -> dict:
    extra = {"policy": args.policy} if args.policy != "reactive" else {}
    if args.throughput_per_replica:
        extra["throughputPerReplica"] = args.throughput_per_replica
    return {**AUTOSCALING, **extra}


def prompt_of(tokens: int, tokenizer, rng: random.Random) -> str:
    """Words of the demo vocabulary until the demo tokenizer counts `tokens` (the usage reports the exact count)."""
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words)).ids) < tokens:
        words.append(rng.choice(["pod", "node", "cache", "token", "queue", "replica", "model", "batch"]))
    return " ".join(words)


def workload(args) -> list[tuple[float, str, int]]:
    """(arrival, prompt, max_tokens) of every request: the burst's Poisson arrivals with one prompt and length,
    or the trace file's requests with their own."""
    rng = random.Random(args.seed)
    if not args.trace_file:
        prompt = " ".join(rng.choice(["pod", "node", "cache", "token", "queue"]) for _ in range(args.prompt_words))
        return [(t, prompt, args.max_tokens)
                for t in arrivals(args.base_rate, args.burst_rate, args.phase_seconds, args.seed)]
    from kubeinfer.runtime.demo import train_tokenizer
    tokenizer = train_tokenizer()
    trace = load_trace(args.trace_file, args.compress_to, args.rate_scale, args.seed,
                       max_prompt=args.max_prompt_tokens, max_output=args.max_output_tokens)
    return [(t, prompt_of(p, tokenizer, rng), o) for t, p, o in trace.requests]


def arrivals(base: float, burst: float, phase_s: float, seed: int) -> list[float]:
    rng, out, t = random.Random(seed), [], 0.0
    while True:
        rate = burst if phase_s <= t < 2 * phase_s else base
        t += rng.expovariate(rate)
        if t >= 3 * phase_s:
            return out
        out.append(t)


async def one_request(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, record: dict,
                      model: str = NAME):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    try:
        async with session.post(url + "/completions", json=body, trace_request_ctx=record) as response:
            record["status"] = response.status
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and "ttft" not in record:
                    record["ttft"] = time.monotonic() - sent
                if chunk.get("usage"):
                    record["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
                    record["output_tokens"] = chunk["usage"]["completion_tokens"]
    except aiohttp.ClientError as error:
        record["error"] = str(error)


def connect_timer() -> aiohttp.TraceConfig:
    """Records in a request's record how long opening its connection took, when it opened one (`connect_s`): the
    client keeps its connections, so most requests reuse one."""
    timer = aiohttp.TraceConfig()

    async def started(session, context, params) -> None:
        context.trace_request_ctx["connect_started"] = time.monotonic()

    async def ended(session, context, params) -> None:
        record = context.trace_request_ctx
        record["connect_s"] = time.monotonic() - record.pop("connect_started")

    timer.on_connection_create_start.append(started)
    timer.on_connection_create_end.append(ended)
    return timer


async def run_load(url: str, requests: list[tuple[float, str, int]], sample) -> list[dict]:
    records = [{"arrival": t, "prompt": prompt, "max_tokens": n} for t, prompt, n in requests]
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trace_configs=[connect_timer()],
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        tasks = []
        sampler = asyncio.create_task(sample(started))
        for record in records:
            await asyncio.sleep(max(0.0, started + record["arrival"] - time.monotonic()))
            tasks.append(asyncio.create_task(one_request(session, url, record["prompt"], record["max_tokens"],
                                                         record)))
        await asyncio.gather(*tasks)
        await asyncio.sleep(AUTOSCALING["scaleDownStabilizationSeconds"] + 15)   # the scale-down, seen
        sampler.cancel()
    return records


def main() -> None:
    exit_on_sigterm()   # `kill` stops what it started (the finally blocks, subprocess.run's child)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--base-rate", type=float, default=1.0)
    parser.add_argument("--burst-rate", type=float, default=8.0)
    parser.add_argument("--phase-seconds", type=float, default=40.0)
    parser.add_argument("--prompt-words", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-file", type=Path, help="replay this CSV trace instead of the burst")
    parser.add_argument("--compress-to", type=float, default=180.0, help="the trace's span, in seconds here")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="thin (< 1) or multiply the trace's requests")
    parser.add_argument("--max-prompt-tokens", type=int, default=300)
    parser.add_argument("--max-output-tokens", type=int, default=48)
    parser.add_argument("--policy", choices=("reactive", "predictive"), default="reactive")
    parser.add_argument("--throughput-per-replica", type=float, help="spec.autoscaling.throughputPerReplica")
    parser.add_argument("--plot", help="write a PNG of both runs here")
    args = parser.parse_args()
    if args.plot and importlib.util.find_spec("matplotlib") is None:   # before minutes of load, not after
        parser.error("--plot needs matplotlib: pip install -e '.[bench]'")
    requests = workload(args)
    args.duration = args.compress_to if args.trace_file else 3 * args.phase_seconds
    kube_config.load_kube_config(args.kubeconfig)
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "apply", "--server-side", "--force-conflicts",
                    "-f", str(ROOT / "crds")], check=True, capture_output=True)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as error:
        if error.status != 409:
            raise
    env = {**os.environ, "KUBECONFIG": args.kubeconfig}
    log = open("/tmp/burst-operator.log", "w")
    operator = subprocess.Popen([sys.executable, "-P", "-m", "kubeinfer.operator", "-n", NAMESPACE], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd="/")
    timeline: list[tuple[float, int, int]] = []
    calibration: list[tuple[float, str | None]] = []   # predictive: what the calibration waits for (None: a model)
    arrivals_from: list[str | bool] = []   # predictive, every second: the rate a pass used (False: no recent rate)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                               inference_service(args.image, autoscaling_of(args)))
        url = wait_ready(core, custom)
        load = (f"{args.trace_file.name}: {len(requests)} requests over {args.duration:.0f} s" if args.trace_file else
                f"{args.base_rate}/s, {args.burst_rate}/s, {args.base_rate}/s for {args.phase_seconds:.0f} s each")
        print(f"ready; policy {args.policy}; load: {load}", flush=True)

        async def sample(started: float) -> None:
            while True:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
                timeline.append((time.monotonic() - started, obj["spec"].get("replicas", 1),
                                 len(ready_pods(core))))
                predictive = obj.get("status", {}).get("predictive")
                if predictive:
                    calibration.append((timeline[-1][0], None if predictive.get("replicaModel")
                                        else predictive.get("calibrationWaitsFor")))
                    arrivals_from.append((obj["status"].get("lastSignals") or {}).get("recentRequestRate") is not None
                                         and (predictive.get("forecast") or {}).get("arrivalRateFrom"))
                await asyncio.sleep(1.0)

        records = asyncio.run(run_load(url, requests, sample))
        cold_starts = observed_cold_starts(core)
        intervals = token_intervals(core)
    finally:
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
        except ApiException:
            pass
        time.sleep(3)
        operator.terminate()
        operator.wait(30)
    report(args, records, timeline, cold_starts, intervals, calibration, arrivals_from)


def token_intervals(core) -> dict[str, float]:
    """Mean seconds between two tokens of a request (the API side's ITL) and mean engine forward, over the
    pods still up, from their own /metrics: what one engine step really costs on this node under this load."""
    sums = {"kubeinfer_inter_token_latency_seconds": [0.0, 0.0], "kubeinfer_engine_step_seconds": [0.0, 0.0]}
    for pod in ready_pods(core):
        pod_sums = histogram_sums(httpx.get(f"http://{pod.status.pod_ip}:8000/metrics", timeout=5).text)
        for name, total in sums.items():
            total[0] += pod_sums[name][0]
            total[1] += pod_sums[name][1]
    return {name: total[0] / total[1] if total[1] else float("nan") for name, total in sums.items()}


def wait_ready(core, custom) -> str:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
        if obj.get("status", {}).get("readyReplicas") and ready_pods(core):
            svc = core.read_namespaced_service(NAME, NAMESPACE)
            return f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}/v1"
        time.sleep(0.5)
    raise SystemExit("the InferenceService was not Ready in 180 s; see /tmp/burst-operator.log")


def ready_pods(core) -> list:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"kubeinfer.dev/inferenceservice={NAME}").items
    return [p for p in pods if not p.metadata.deletion_timestamp and is_ready(p)]


def is_ready(pod) -> bool:
    """The pod's Ready condition is True (a client's V1Pod)."""
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def observed_cold_starts(core) -> list[float]:
    seconds = []
    for pod in ready_pods(core):
        ready = next(c for c in pod.status.conditions if c.type == "Ready")
        seconds.append(ready.last_transition_time.timestamp() - pod.metadata.creation_timestamp.timestamp())
    return seconds


def simulate(args, records: list[dict], cold_start_s: float, slowdown: float = 1.0, tail_s: float = 0.0) -> Simulation:
    """The same requests in the simulator; `slowdown` multiplies the calibrated replica's step times; the policy
    goes on deciding `tail_s` after the trace (as the real operator did while the run was watched)."""
    duration = args.duration
    peak = max(len([r for r in records if t <= r["arrival"] < t + 10]) / 10 for t in range(0, int(duration) + 1, 5))
    trace = Trace("real replay", duration, lambda t: peak, peak)
    base = CPU_DEMO_MODEL
    model = replace(base, cold_start_s=cold_start_s, max_batch=MAX_NUM_SEQS,
                    decode_base_s=base.decode_base_s * slowdown, decode_per_seq_s=base.decode_per_seq_s * slowdown,
                    prefill_s_per_token=base.prefill_s_per_token * slowdown)
    config = PolicyConfig.from_spec(autoscaling_of(args))
    policy = OperatorPredictivePolicy(config) if args.policy == "predictive" else KubeInferPolicy(config)
    sim = Simulation(trace, policy, initial_replicas=1, model=model, tail_s=tail_s)
    sim.requests = [Request(r["arrival"], r.get("prompt_tokens", 1), r.get("output_tokens", r["max_tokens"]))
                    for r in records]
    return sim.run()


def replicas_at(timeline: list[tuple[float, int, int]], t: float) -> tuple[int, int]:
    before = [row for row in timeline if row[0] <= t]
    return (before[-1][1], before[-1][2]) if before else (1, 1)


def report(args, records: list[dict], timeline, cold_starts: list[float], intervals: dict[str, float],
           calibration: list[tuple[float, str | None]], arrivals_from: list[str | bool]) -> None:
    served = [r for r in records if "ttft" in r]
    errors = [r for r in records if "ttft" not in r]
    cold_start = statistics.median(cold_starts) if cold_starts else 5.0
    prompt_tokens = statistics.median(r["prompt_tokens"] for r in served)
    output_tokens = statistics.median(r["output_tokens"] for r in served)
    # The calibrated replica's step at a full batch, against the real pods' mean time between two tokens.
    model = CPU_DEMO_MODEL
    modelled = (model.decode_base_s + model.decode_per_seq_s * MAX_NUM_SEQS
                + model.prefill_s_per_token * prompt_tokens / output_tokens)
    slowdown = intervals["kubeinfer_inter_token_latency_seconds"] / modelled
    print(f"\n{len(records)} requests ({len(errors)} without a first token), prompt {prompt_tokens:.0f} tokens, "
          f"{output_tokens:.0f} output tokens (medians); cold start creation -> Ready (real pods, median of "
          f"{len(cold_starts)}): {cold_start:.1f} s")
    print(f"real pods: mean time between two tokens {intervals['kubeinfer_inter_token_latency_seconds'] * 1e3:.1f} "
          f"ms, mean engine forward {intervals['kubeinfer_engine_step_seconds'] * 1e3:.1f} ms; the calibrated "
          f"model's step at {MAX_NUM_SEQS} sequences: {modelled * 1e3:.1f} ms (x{slowdown:.1f})")
    runs = []
    for label, factor in (("calibrated offline (engine steps alone)", 1.0),
                          (f"recalibrated from this run (steps x{slowdown:.1f})", slowdown)):
        print(f"\n### simulated: {label}")
        sim = simulate(args, served, cold_start, factor, tail_s=max(0.0, timeline[-1][0] - args.duration))
        runs.append((label, sim, table(args, served, timeline, sim)))
        if args.policy == "predictive":
            print(f"calibrated replica model in use: real {calibrated_from(calibration)}; simulated "
                  f"{calibrated_from(sim.policy.calibration_log)}")
            print(f"arrival rate from the last 15 s (the fast rule): real {rate_sources(arrivals_from)} of the "
                  f"seconds sampled; simulated {rate_sources(sim.policy.arrivals_from)} of the passes")
    if args.plot:
        plot(args.plot, served, timeline, runs, AUTOSCALING["targetTTFTP95Seconds"])


def table(args, served: list[dict], timeline, sim: Simulation) -> dict[float, float]:
    """Prints the real run beside `sim` in 10 s windows; returns the simulated TTFT by arrival."""
    sim_ttft = {round(req.arrival, 6): req.first_token - req.arrival for req in sim.requests}
    target = AUTOSCALING["targetTTFTP95Seconds"]
    print("| window (s) | arrivals/s | real spec.replicas / ready | sim replicas / ready | real TTFT P50 / P95 (s) | "
          "sim TTFT P50 / P95 (s) |")
    print("|---|---|---|---|---|---|")
    step = 10.0
    for start in [i * step for i in range(int(args.duration // step) + 3)]:
        window = [r for r in served if start <= r["arrival"] < start + step]
        real = sorted(r["ttft"] for r in window)
        simulated = sorted(sim_ttft.get(round(r["arrival"], 6), float("nan")) for r in window)
        spec_n, ready_n = replicas_at(timeline, start + step)
        index = min(int(start + step), len(sim.samples.t) - 1)
        print(f"| {start:.0f}–{start + step:.0f} | {len(window) / step:.1f} | {spec_n} / {ready_n} | "
              f"{sim.samples.replicas[index]} / {sim.samples.ready[index]} | {quantiles(real)} | {quantiles(simulated)} |")
    real_share = sum(r["ttft"] <= target for r in served) / len(served)
    sim_share = sum(v <= target for v in sim_ttft.values()) / len(sim_ttft)
    print(f"\nTTFT within {target} s: real {real_share:.1%}, simulated {sim_share:.1%}; scale events: real "
          f"{transitions(timeline)}, simulated {[(round(t), a, b) for t, a, b in sim.scale_events]}")
    late = [r for r in served if r["ttft"] > target]
    opened = [r for r in served if "connect_s" in r]
    late_opened = sorted(r["connect_s"] for r in late if "connect_s" in r)
    print(f"real requests that opened a connection: {len(opened)} of {len(served)}, connect P50 / P95 "
          f"{quantiles(sorted(r['connect_s'] for r in opened))} s; of the {len(late)} late: {len(late_opened)} "
          f"opened one, connect P50 / P95 {quantiles(late_opened)} s")
    return sim_ttft


def calibrated_from(log: list[tuple[float, str | None]]) -> str:
    """When the predictive policy's first calibrated replica model was in use, and what the calibration waited for
    every 20 s before (from `status.predictive` on the cluster, the policy's own log in the simulator)."""
    ready = next((t for t, waits in log if waits is None), None)
    waited, mark = [], 0.0
    for t, waits in log:
        if waits is not None and t >= mark:
            waited.append(f"{t:.0f} s: {waits}")
            mark = t + 20.0
    return (f"from {ready:.0f} s" if ready is not None else "never") + (f" (waiting at {'; '.join(waited)})"
                                                                        if waited else "")


def rate_sources(sources: list[str | bool]) -> str:
    """How often a pass had a recent rate, and how often it used it (a significant rise)."""
    n = max(len(sources), 1)
    return (f"{sum(1 for x in sources if x) / n:.0%} had one, {sum(1 for x in sources if x == 'recent') / n:.0%} "
            f"used it")


def quantiles(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{values[len(values) // 2]:.2f} / {values[min(len(values) - 1, int(0.95 * len(values)))]:.2f}"


def transitions(timeline) -> list[tuple[int, int, int]]:
    out, last = [], None
    for t, spec_n, _ in timeline:
        if last is not None and spec_n != last:
            out.append((round(t), last, spec_n))
        last = spec_n
    return out


def plot(path: str, served: list[dict], timeline, runs: list, target: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.step([t for t, _, _ in timeline], [n for _, _, n in timeline], where="post", label="real: ready pods")
    top.step([t for t, n, _ in timeline], [n for _, n, _ in timeline], where="post", ls="--",
             label="real: spec.replicas")
    for label, sim, _ in runs:
        top.step(sim.samples.t, sim.samples.ready, where="post", label=f"simulated, {label.split(' (')[0]}: ready")
    top.set_ylabel("replicas")
    top.legend(loc="upper right")
    bottom.scatter([r["arrival"] for r in served], [r["ttft"] for r in served], s=6, label="real TTFT")
    for label, _, sim_ttft in runs:
        bottom.scatter([r["arrival"] for r in served], [sim_ttft.get(round(r["arrival"], 6)) for r in served], s=6,
                       label=f"simulated, {label.split(' (')[0]}")
    bottom.axhline(target, color="grey", lw=0.8, ls=":")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds since the load started")
    bottom.set_ylabel("TTFT (s)")
    bottom.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
