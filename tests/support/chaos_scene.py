"""The chaos suite's scene and its one step (tests/e2e/chaos; docs/e2e.md, "Chaos suite"): faults injected under
steady load through the operator's router (`spec.router`), on the real cluster of tests/e2e.

- `Scene`: an InferenceService of `REPLICAS` CPU replicas of the demo model behind `ROUTER_REPLICAS` router pods,
  and the operator (`kubeinfer operator`, a process on this machine, as in the other e2e modules) that runs it.
- `run_fault`: waits until the service serves at its replica count, starts the load (`chaos_load.Load`), lets it
  run, injects the fault, measures the recovery (the fault's start until the service serves again at its replica
  count: every replica Ready, every router pod Ready and told every replica, a request through the router
  answered), keeps the load a few seconds more, stops it and records one row of the chaos table (`ROWS`): requests
  sent, completed, resumed and retried (the routers' `kubeinfer_router_resumes_total`), failed with a clean error,
  lost, recovery.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from support.chaos_load import Load, Outcome
from support.cluster import (
    OperatorProcess, condition, eventually, pod_counter, pods_of, ready_pods, service_url,
)
from support.router_view import metrics, replica_urls, router_pods, told, total

NAME = "chaos"
REPLICAS, ROUTER_REPLICAS, QUEUE_TIMEOUT_S = 2, 2, 30
CONCURRENCY, MAX_TOKENS = 6, 256
SETTLE_S, AFTER_S = 3.0, 5.0      # steady load before the fault, and after the recovery
LOAD_LIMIT_S = 600                # the load stops by itself after this, whatever the test does
RECOVERY_LIMIT_S = 300            # a replica pod's restart, model load included, fits many times over
SPEC = {"model": {"uri": "file:///opt/kubeinfer/models/demo"}, "replicas": REPLICAS,
        "runtime": {"imagePullPolicy": "IfNotPresent"}, "resources": {"gpus": 0, "cpu": "250m", "memory": "2Gi"},
        "router": {"replicas": ROUTER_REPLICAS, "queueTimeoutSeconds": QUEUE_TIMEOUT_S}}
ROWS: list[dict[str, Any]] = []


@dataclasses.dataclass
class Scene:
    kube: Any
    ns: str
    operator: OperatorProcess
    name: str = NAME
    replicas: int = REPLICAS
    concurrency: int = CONCURRENCY
    models: list[str] | None = None     # what each load client asks for (default: the service's name)
    api_keys: list[str] | None = None   # and the key each sends, if the service has keys
    prompt_repeat: int = 1              # each client's prompt said this many times
    current_load: Load | None = None    # the load of the fault running now (run_fault)

    @property
    def router_url(self) -> str:
        return service_url(self.kube, self.ns, f"{self.name}-router")

    def load(self, max_tokens: int, concurrency: int | None = None, api_keys: list[str] | None = None) -> Load:
        """The steady load of this scene (not started)."""
        return Load(self.router_url, self.models or self.name, concurrency or self.concurrency, max_tokens,
                    QUEUE_TIMEOUT_S, LOAD_LIMIT_S, api_keys or self.api_keys, self.prompt_repeat)

    def serving(self) -> bool:
        """Every replica Ready (`replicas` of them, none other), every router pod Ready and told exactly those, and a
        request through the router's Service answered."""
        pods = [p for p in pods_of(self.kube, self.ns, self.name) if not p["metadata"].get("deletionTimestamp")]
        if len(pods) != self.replicas or len(ready_pods(self.kube, self.ns, self.name)) != self.replicas:
            return False
        want = replica_urls(self.kube, self.ns, self.name)
        routers = router_pods(self.kube, self.ns, self.name)
        if len(routers) != ROUTER_REPLICAS or not all(
                told(p) == want and condition(p, "Ready").get("status") == "True" for p in routers):
            return False
        answer = httpx.post(self.router_url + "/completions", timeout=QUEUE_TIMEOUT_S + 30, json={
            "model": self.name, "prompt": "probe", "max_tokens": 2, "ignore_eos": True},
            headers={"Authorization": f"Bearer {self.api_keys[0]}"} if self.api_keys else None)
        return answer.status_code == 200

    def router_counters(self) -> dict[str, dict[str, float]]:
        """Each router pod's resume counters, by pod name."""
        out = {}
        for pod in router_pods(self.kube, self.ns, self.name):
            try:
                page = metrics(f"http://{pod['status']['podIP']}:8080")
            except (httpx.HTTPError, KeyError):
                continue
            out[pod["metadata"]["name"]] = {outcome: total(page, "kubeinfer_router_resumes_total", outcome=outcome)
                                            for outcome in ("resumed", "retried", "failed")}
        return out


def create_service(kube: Any, ns: str, spec: dict[str, Any], name: str = NAME) -> None:
    kube.request("POST", f"/apis/kubeinfer.dev/v1alpha1/namespaces/{ns}/inferenceservices", body={
        "apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": name, "namespace": ns},
        "spec": spec})


# The engine is the API process's child, started by multiprocessing's spawn (runtime/server/engine_start.py):
# its command line holds `spawn_main`. `[s]` keeps the pattern from matching the shell's own command line.
ENGINE_PIDS = "grep -la '[s]pawn_main' /proc/[0-9]*/cmdline | cut -d/ -f3"   # with tensor parallelism: every rank
KILL_ENGINE = f"kill -9 $({ENGINE_PIDS})"


def restarts(scene: Scene, pod: str) -> int:
    return scene.kube.get(f"/api/v1/namespaces/{scene.ns}/pods/{pod}")["status"]["containerStatuses"][0]["restartCount"]


def busiest_replica(scene: Scene) -> dict:
    """The Ready replica pod running the most requests, once one runs any (the router may keep the load on one
    replica: a victim with nothing running would show nothing)."""
    def busiest() -> dict | None:
        running = {p["metadata"]["name"]: (pod_counter(p, "kubeinfer_num_requests_running"), p)
                   for p in ready_pods(scene.kube, scene.ns, scene.name)}
        count, pod = max(running.values(), key=lambda item: item[0])
        print(f"\nchaos: requests running per replica {({name: n for name, (n, _) in running.items()})}")
        return pod if count > 0 else None
    return eventually(busiest, 60, "a replica running requests", 0.2)


def run_fault(scene: Scene, fault: str, injected: str, inject: Callable[[], Any],
              recovered: Callable[[], bool] | None = None, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """One row of the chaos table: `inject()` (which returns once the fault is in place, or over for a fault
    that lasts) under steady load; see the module's docstring. `recovered`: what recovery means, when it is not
    serving at the replica count (that was never lost). `max_tokens`: of each request (longer streams outlive
    a fault that gives the replica a moment to finish)."""
    eventually(scene.serving, RECOVERY_LIMIT_S, "the service serving at its replica count before the fault", 1)
    before = scene.router_counters()
    load = scene.current_load = scene.load(max_tokens).start()
    try:
        time.sleep(SETTLE_S)
        fault_at = time.monotonic()
        inject()
        in_place = time.monotonic() - fault_at
        eventually(recovered or scene.serving, RECOVERY_LIMIT_S, f"the service recovered after: {injected}", 0.5)
        recovery = time.monotonic() - fault_at
        time.sleep(AFTER_S)
    finally:
        outcomes = load.finish()
    after = scene.router_counters()
    resumes = {kind: sum(after[pod][kind] - before[pod][kind] for pod in after if pod in before)
               for kind in ("resumed", "retried", "failed")}
    counts = load.counts()
    row = {"fault": fault, "injected": injected, "sent": len(outcomes), "completed": counts["completed"],
           "resumed": int(resumes["resumed"]), "retried": int(resumes["retried"]), "failed": counts["failed"],
           "lost": counts["lost"], "differs": load.differs(), "recovery_s": round(recovery, 1),
           "inject_s": round(in_place, 1),
           "bound_s": round(load.bound_s, 1),
           "problems": [describe(o, load) for o in outcomes if o.outcome != "completed"],
           "routers_before": before, "routers_after": after}
    ROWS.append(row)
    print(f"\nchaos: {json.dumps(row)}")
    return row


def describe(outcome: Outcome, load: Load) -> str:
    return (f"{outcome.outcome} ({load.model_of(outcome.client)}, {'stream' if outcome.streamed else 'plain'}, "
            f"{outcome.seconds:.1f} s): {outcome.detail}")


def assert_nothing_lost(row: dict[str, Any]) -> None:
    lost = [p for p in row["problems"] if p.startswith("lost")]
    assert row["lost"] == 0, lost[:5]
    assert row["completed"] > 0, row
