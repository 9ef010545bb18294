"""The router's own Prometheus metrics (`kubeinfer_router_*`), served at its `/metrics`.

`kubeinfer_router_queue_requests` is the number the autoscaler needs to scale from zero: requests held here
because no replica is ready, which no replica can report.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025,
                 0.05, 0.1, 0.25)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LORA_LOAD_OUTCOMES = ("loaded", "failed", "unreachable")


class RouterMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_requests = Gauge("kubeinfer_router_queue_requests", "Requests waiting for a ready replica",
                                    registry=r)
        self.queue_bytes = Gauge("kubeinfer_router_queue_bytes", "Bytes of request bodies waiting for a replica",
                                 registry=r)
        self.queue_wait = Histogram("kubeinfer_router_queue_wait_seconds", "Time requests waited for a ready replica",
                                    buckets=WAIT_BUCKETS, registry=r)
        self.replicas_up = Gauge("kubeinfer_router_replicas_up", "Replicas that can be picked", registry=r)
        self.in_flight = Gauge("kubeinfer_router_requests_in_flight", "Requests open on each replica", ["replica"],
                               registry=r)
        self.picks = Counter("kubeinfer_router_picks", "Requests sent to a replica, by replica and reason",
                             ["replica", "reason"], registry=r)
        self.upstream_errors = Counter("kubeinfer_router_upstream_errors",
                                       "Failures talking to a replica: connect and draining (both retried "
                                       "elsewhere), disconnect (mid-request), engine_dead (its engine died), "
                                       "timeout", ["kind"], registry=r)
        self.resumes = Counter("kubeinfer_router_resumes", "Requests whose replica failed: retried (before its "
                               "answer started), resumed (a stream, on another replica), failed (ended with an "
                               "error event)", ["outcome"], registry=r)
        self.refused = Counter("kubeinfer_router_refused", "Requests the router answered itself with an error",
                               ["status_code"], registry=r)
        self.added = Histogram("kubeinfer_router_added_latency_seconds",
                               "Router time before a request is on its way to a replica (reading, parsing, "
                               "picking; waiting for a replica excluded)", buckets=ADDED_BUCKETS, registry=r)
        self.lora_loads = Counter("kubeinfer_router_lora_loads", "LoRA adapter loads the router asked of a replica: "
                                  "loaded, failed (the replica refused: its error goes to the client), unreachable "
                                  "(no answer: tried on another replica)", ["outcome"], registry=r)
        self.lora_load_seconds = Histogram("kubeinfer_router_lora_load_seconds", "Time a replica took to load a LoRA "
                                           "adapter the router asked for (loaded ones)", buckets=WAIT_BUCKETS,
                                           registry=r)
        self.lora_load_waiting = Gauge("kubeinfer_router_lora_load_waiting_requests", "Requests waiting for their "
                                       "LoRA adapter to be loaded on a replica", registry=r)
        self.lora_replicas = Gauge("kubeinfer_router_lora_adapter_replicas", "Replicas up with each LoRA adapter "
                                   "loaded", ["adapter"], registry=r)
        self.lora_not_loaded = Counter("kubeinfer_router_lora_not_loaded", "Requests a replica answered 404 for an "
                                       "adapter the router thought loaded there (it dropped it): placed again",
                                       registry=r)
        self.disaggregated = Counter("kubeinfer_router_disaggregation_requests", "With a prefill pool, requests by "
                                     "path: disaggregated (to a decode replica naming a prefill replica's KV endpoint), "
                                     "fallback (its KV transfer failed: sent again colocated), colocated (not "
                                     "eligible, or no prefill replica up)", ["path"], registry=r)
        self.prefill_up = Gauge("kubeinfer_router_prefill_replicas_up", "Prefill replicas that can be picked (with "
                                "a KV endpoint)", registry=r)
        self.pool_wakeups = Counter("kubeinfer_router_pool_wakeups", "A model pool's models this router woke (after "
                                    "putting the least recently used to sleep where the pod had no room)", ["model"],
                                    registry=r)
        self.pool_sleeps = Counter("kubeinfer_router_pool_sleeps", "A model pool's models this router put to sleep "
                                   "to make room", ["model"], registry=r)
        self.pool_wake_seconds = Histogram("kubeinfer_router_pool_wake_seconds", "Seconds from a request finding its "
                                           "model asleep to the model awake (the sleep that made room included)",
                                           ["model"], buckets=WAIT_BUCKETS, registry=r)
        self.pool_waited = Counter("kubeinfer_router_pool_waited_requests", "Requests that waited for their model "
                                   "to be woken", ["model"], registry=r)
        self.pool_waiting = Gauge("kubeinfer_router_pool_waiting_requests", "Requests waiting now for a wake-up",
                                  registry=r)
        self.pool_awake = Gauge("kubeinfer_router_pool_model_awake", "1 where a model is awake (and up) on a pod",
                                ["model", "pod"], registry=r)
        for outcome in LORA_LOAD_OUTCOMES:
            self.lora_loads.labels(outcome)
        for kind in ("connect", "draining", "disconnect", "engine_dead", "timeout"):
            self.upstream_errors.labels(kind)
        for outcome in ("retried", "resumed", "failed"):
            self.resumes.labels(outcome)
