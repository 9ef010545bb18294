"""The autoscaler's guards at fleet scale: 50 autoscaled InferenceServices under bursty traffic at once, on a real
API server with a fake node whose pods turn Ready a cold start after they are created.

    # a control plane of its own (other ports), so a cluster in use elsewhere is left alone:
    mkdir -p /work/k8s-guards && ln -sfn /work/k8s-local/bin /work/k8s-guards/bin
    K8S_LOCAL=/work/k8s-guards K8S_PORT=7443 ETCD_PORT=3379 ETCD_PEER_PORT=3380 KCM_PORT=11257 SCHED_PORT=11259 \\
        FRESH=1 bash ../shared/k8s-local/up.sh
    python -P benchmarks/autoscale_guards.py --kubeconfig /work/k8s-guards/kubeconfig [--count 50] [--seconds 900]

`kubeinfer operator` runs as a process on this machine (reactive policy, 5 s interval) against a stand-in
Prometheus (benchmarks/trace_prometheus.py) whose queue and arrival series follow each service's own bursty
trace, served by the pods the API server says are Ready. The fake node (shared/k8s-local/fake_node.py) makes a
pod Ready `--cold-start` seconds after it is created. Every second the Deployments are read; at the end:
- **scale-ups while pods were pending**, and of those **stacked**: ordered while the replicas already ordered
  were still starting and the arrival rate had not risen by 10% since the scale-up that ordered them (the bug of
  AIBrix #2670: the queue keeps growing during a cold start and each pass orders more). Counted twice: with the
  trace's rate at the moment the new replicas were seen ordered and the recommendation higher than the last
  scale-up's (the first yardstick), and with **the rate the policy could have seen** and the order beyond the last
  scale-up's recommendation. The policy measures arrivals from the queue's growth between the signals of its last
  two passes (each pass logs its signals' time: the tick of the queue it read, which may be up to an interval older
  than the pass, as the fleet's round of queries serves every pass of an interval), so a burst that began inside
  that span is seen in part, and the next pass's order for the rest of the same step is not a stack on pending pods;
  with the last pass more than a metric window back it has one queue sample and sees only what the ready replicas
  serve. An order of the steady rule (the queue within its band) is sized for the arrival rate over the metric
  window, so that is what it saw: the next order for a step the window's mean diluted is for traffic it did not.
  An order that goes on to the last scale-up's recommendation (held back by maxScaleUpStep, or cut there by the
  policy's own pending guard while its raw recommendation is higher) orders nothing that one did not;
- **the peak fleet against the need**: the most replicas a service held, against the replicas its peak rate
  needs at full use (the fleet must also drain the backlog the cold start let build, so some excess is due);
- **flaps**: changes of direction of spec.replicas per service, per hour, against the policy's own bound (a
  scale-down needs a scale-down window of lower recommendations, so at most 2 changes of direction a window).
Needs a fresh control plane (the namespace must not exist); leaves the fleet in place. `--ups PATH` writes every
scale-up made while pods were pending (time, counts, queue, both rates, whether stacked by each yardstick) as JSON
lines, to be read beside the operator's log (`--log`: the policy's reasons, in the same order per service).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client, config as kube_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_scale import (  # noqa: E402
    AUTOSCALE_INTERVAL_S, FAKE_NODE, GROUP, PLURAL, VERSION, OperatorProcess, create_crds,
)
from trace_prometheus import RATE_PER_REPLICA, BurstyTrace, TracePrometheus  # noqa: E402

import operator_scale  # noqa: E402
from kubeinfer.operator.times import unix  # noqa: E402

NAMESPACE = "kubeinfer-guards"
INSTANCE_LABEL = f"{GROUP}/inferenceservice"
RISE = 1.1   # an arrival rate 10% above the last scale-up's is a new reason to order more
# Where the log does not show a scale-up's pass, the span the policy's arrival estimate covers before the order is
# seen here: one pass interval (the queue's growth between two passes) and the up to one second this loop takes to
# read the order.
SEEN_SPAN_S = AUTOSCALE_INTERVAL_S + 1.0
# a pass that decided from signals; group 2: a scale-up; group 3: its message; group 4: the time of its signals
PASS = re.compile(rf"^autoscale {NAMESPACE}/(\S+): (?!Metrics)(Scale(?:Up|FromZero) )?(.*); signals of (\S+)$", re.M)
# The message of the steady rule (policy.py: "R req/s = L replicas busy"), which sizes for the metric window's arrival
# rate, not for the queue's growth over the pass.
WINDOW_RULE = re.compile(r"req/s = [\d.]+ replicas busy")
METRIC_WINDOW_S = 30   # the services' metricWindowSeconds
SCALE_UP = re.compile(rf"autoscale {NAMESPACE}/(\S+): Scale(?:Up|FromZero) \d+ -> \d+ \(recommended (\d+)\)")


def service(name: str, args: argparse.Namespace) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "metadata": {"name": name},
            "spec": {"model": {"uri": "file:///models/tiny", "servedName": name},
                     "resources": {"gpus": 0, "cpu": "10m", "memory": "256Mi"}, "runtime": {"maxModelLen": 512},
                     "autoscaling": {"minReplicas": 1, "maxReplicas": args.max_replicas,
                                     "targetQueueDepthPerReplica": 4, "metricWindowSeconds": 30,
                                     "scaleDownStabilizationSeconds": args.scale_down_window,
                                     "initialDelaySeconds": 0, "throughputPerReplica": 2}}}


def read_fleet(apps: client.AppsV1Api, names: set[str]) -> dict[str, tuple[int, int]]:
    """(spec.replicas, readyReplicas) of each service's Deployment."""
    fleet = {}
    for d in apps.list_namespaced_deployment(NAMESPACE).items:
        name = (d.metadata.labels or {}).get(INSTANCE_LABEL)
        if name in names:
            fleet[name] = (d.spec.replicas or 0, d.status.ready_replicas or 0)
    return fleet


def recommendations(log_text: str) -> dict[str, list[int]]:
    """Each service's recommendation at each of its scale-ups, in order, from the operator's log."""
    recs: dict[str, list[int]] = {}
    for name, rec in SCALE_UP.findall(log_text):
        recs.setdefault(name, []).append(int(rec))
    return recs


def drain_need(rate: float, queue: float, cold_start_s: float) -> int:
    """Replicas that serve `rate` and drain `queue` within one cold start, at full use."""
    return max(1, math.ceil((rate + queue / cold_start_s) / RATE_PER_REPLICA))


def seen_rate(trace: BurstyTrace, t: float, span_s: float = SEEN_SPAN_S) -> float:
    """The trace's mean rate over the `span_s` before `t`: what the policy's arrival estimate could show then."""
    steps = 60
    return sum(trace.rate(t - span_s * (k + 0.5) / steps) for k in range(steps)) / steps


def policy_seen(trace: BurstyTrace, passes: list[tuple[float, bool, bool]], up: int, ready: int,
                t: float) -> tuple[float, float | None]:
    """(the arrival rate the policy could have seen at its `up`-th scale-up (1-based), the trace time of the signals
    it read): for an order of the steady rule, which sizes for the arrival rate over the metric window, the trace's
    mean over the window before its signals; else the trace's mean between the signals of the pass that made it
    and those of the one before (the queue's growth), the ready replicas' service if those are more than a metric
    window back (one queue sample); the mean over SEEN_SPAN_S before `t` if the log does not show the pass."""
    ups = [i for i, (_, is_up, _) in enumerate(passes) if is_up]
    if up > len(ups) or ups[up - 1] == 0:
        return seen_rate(trace, t), None
    (at, _, by_window), before = passes[ups[up - 1]], passes[ups[up - 1] - 1][0]
    if by_window:
        return seen_rate(trace, at, METRIC_WINDOW_S), at
    if at - before > METRIC_WINDOW_S:
        return min(seen_rate(trace, at), ready * RATE_PER_REPLICA), at
    return seen_rate(trace, at, max(at - before, 1.0)), at


class PassTimes:
    """Each service's passes as (trace time of the signals the pass read, a scale-up, sized by the steady rule's
    window rate), from the operator's log read as it is written."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.times = path, 0, {}

    def read(self, trace_start_wall: float | None) -> None:
        """Passes logged since the last read; `trace_start_wall`: the wall time of the trace's time 0 (None before
        the replay: those passes are placed at -1)."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for m in PASS.finditer(data[:end].decode(errors="replace")):
            at = -1.0 if trace_start_wall is None else unix(m.group(4)) - trace_start_wall
            self.times.setdefault(m.group(1), []).append((at, m.group(2) is not None,
                                                          WINDOW_RULE.search(m.group(3)) is not None))


def analyse(samples: list[tuple[float, int, int, float]], recs: list[int], trace: BurstyTrace,
            cold_start_s: float, passes: list[tuple[float, bool, bool]] | None = None) -> dict:
    """Scale-ups, those while pending, those stacked (by the trace's rate, and by the rate the policy could have seen)
    and those beyond the drain need; direction changes; the peak against the need. A scale-up that only goes on
    towards the recommendation of the last one (held back by maxScaleUpStep) is not stacked."""
    ups = while_pending = stacked = stacked_seen = beyond = changes = 0
    last_up_rate = last_up_seen = last_rec = None
    direction, pending_ups = 0, []
    for (t0, spec0, ready0, _), (t1, spec1, _, queue) in zip(samples, samples[1:]):
        if spec1 == spec0:
            continue
        step = 1 if spec1 > spec0 else -1
        changes += direction != 0 and step != direction
        direction = step
        if step > 0:
            rec = recs[ups] if ups < len(recs) else spec1
            ups += 1
            rate, (seen, signals_t) = trace.rate(t1), policy_seen(trace, passes or [], ups, ready0, t1)
            if ready0 < spec0:
                while_pending += 1
                higher = last_rec is not None and rec > last_rec
                by_rate = higher and rate <= RISE * last_up_rate
                by_seen = spec1 > last_rec and seen <= RISE * last_up_seen
                stacked += by_rate
                stacked_seen += by_seen
                beyond += spec1 > drain_need(rate, queue, cold_start_s)
                pending_ups.append({"t": round(t1, 1), "signals_t": signals_t and round(signals_t, 1), "up": ups,
                                    "from": spec0, "to": spec1, "ready": ready0, "rec": rec, "queue": round(queue, 1),
                                    "rate": round(rate, 2), "seen": round(seen, 2), "last_rate": round(last_up_rate, 2),
                                    "last_seen": round(last_up_seen, 2), "stacked": by_rate, "stacked_seen": by_seen})
            last_up_rate, last_up_seen, last_rec = rate, seen, rec
    peak = max(spec for _, spec, _, _ in samples)
    need = max(trace.need(t) for t, _, _, _ in samples)
    return {"ups": ups, "while_pending": while_pending, "stacked": stacked, "stacked_seen": stacked_seen,
            "beyond": beyond, "changes": changes, "peak": peak, "need": need, "pending_ups": pending_ups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=not os.environ.get("KUBECONFIG"))
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=900, help="how long the traffic is replayed")
    parser.add_argument("--cold-start", type=float, default=20, help="seconds from a pod's creation to Ready")
    parser.add_argument("--scale-down-window", type=int, default=60)
    parser.add_argument("--max-replicas", type=int, default=10)
    parser.add_argument("--log", type=Path, default=Path("/tmp/autoscale_guards.log"))
    parser.add_argument("--ups", type=Path, default=None, help="write the scale-ups made while pods were pending")
    args = parser.parse_args()
    operator_scale.NAMESPACE = NAMESPACE   # the operator process watches this namespace

    kube_config.load_kube_config(config_file=args.kubeconfig)
    core, apps, custom = client.CoreV1Api(), client.AppsV1Api(), client.CustomObjectsApi()
    create_crds()
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    names = [f"svc-{i:03d}" for i in range(args.count)]
    traces = {name: BurstyTrace(seed=i, duration_s=args.seconds) for i, name in enumerate(names)}
    fake_node = subprocess.Popen([sys.executable, "-P", str(FAKE_NODE), "--name", "guards-node", "--cpu", "64",
                                  "--pods", str(args.count * args.max_replicas + 50), "--ready-after",
                                  str(args.cold_start), "--kubeconfig", args.kubeconfig],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prometheus = TracePrometheus(NAMESPACE, traces)
    operator = OperatorProcess(args.kubeconfig, prometheus.url, args.log)
    samples: dict[str, list[tuple[float, int, int, float]]] = {name: [] for name in names}
    args.log.unlink(missing_ok=True)   # the recommendations are read from this run's log
    pass_times = PassTimes(args.log)
    try:
        operator.start()
        for name in names:
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, service(name, args))
        wanted = set(names)
        while len({n for n, (_, ready) in read_fleet(apps, wanted).items() if ready >= 1}) < len(names):
            time.sleep(1)
        print(f"{len(names)} services Ready at 1 replica; replaying {args.seconds:.0f} s of traffic", flush=True)
        prometheus.start()
        pass_times.read(None)   # the passes before the replay
        next_report = 60.0
        while (t := prometheus.now()) < args.seconds:
            pass_times.read(prometheus.started_wall)
            fleet = read_fleet(apps, wanted)
            prometheus.set_ready({n: ready for n, (_, ready) in fleet.items()})
            for n, (spec, ready) in fleet.items():
                samples[n].append((t, spec, ready, prometheus.models[n].queue))
            if t >= next_report:
                print(f"  {t:4.0f} s: {sum(s for s, _ in fleet.values())} replicas ordered, "
                      f"{sum(r for _, r in fleet.values())} Ready", flush=True)
                next_report += 60
            time.sleep(max(0.0, 1.0 - (prometheus.now() - t)))
        cpu = operator.cpu_s()
    finally:
        prometheus.stop()
        if operator.proc is not None and operator.proc.poll() is None:
            operator.stop()
        fake_node.terminate()
        fake_node.wait(30)
    log_text = args.log.read_text()
    recs = recommendations(log_text)
    passes = len(PASS.findall(log_text)) / max(1, len(names))
    analysed = {n: analyse(samples[n], recs.get(n, []), traces[n], args.cold_start, pass_times.times.get(n))
                for n in names if len(samples[n]) > 1}
    rows = list(analysed.values())
    if args.ups is not None:
        args.ups.write_text("".join(json.dumps({"service": n, **up}) + "\n"
                                    for n, r in analysed.items() for up in r["pending_ups"]))
    hours = args.seconds / 3600
    bound = 2 * 3600 / args.scale_down_window
    flaps = [r["changes"] / hours for r in rows]
    excess = [r["peak"] - r["need"] for r in rows]
    print(f"\nautoscaler guards: {len(rows)} services, {args.seconds:.0f} s of bursty traffic, cold start "
          f"{args.cold_start:.0f} s, scale-down window {args.scale_down_window} s, {os.cpu_count()} CPUs; "
          f"operator CPU {cpu:.0f} s; unknown queries: {sorted(prometheus.unknown) or 'none'}")
    print(f"passes that decided from signals, per service: {passes:.1f} (one per {AUTOSCALE_INTERVAL_S:g} s on time: "
          f"{args.seconds / AUTOSCALE_INTERVAL_S:.0f}; a pass more than a metric window after the last has one queue "
          f"sample, and its arrival estimate is only what the ready replicas serve)")
    print(f"scale-ups: {sum(r['ups'] for r in rows)}; while pods were pending: "
          f"{sum(r['while_pending'] for r in rows)}; stacked (rate not up {RISE - 1:.0%} since the last): "
          f"{sum(r['stacked'] for r in rows)}; by the rate the policy could have seen and orders beyond the last "
          f"recommendation: {sum(r['stacked_seen'] for r in rows)}; beyond the drain need (rate + queue "
          f"/ cold start, at {RATE_PER_REPLICA:g} req/s a replica): {sum(r['beyond'] for r in rows)}")
    print(f"peak replicas - need at the peak rate: mean {statistics.mean(excess):+.2f}, max {max(excess):+d} "
          f"(services above: {sum(e > 0 for e in excess)})")
    print(f"direction changes per hour per service: mean {statistics.mean(flaps):.1f}, max {max(flaps):.1f}, "
          f"bound {bound:.0f} (2 per scale-down window)")


if __name__ == "__main__":
    main()
