"""The sleep series of `/metrics` (docs/runtime.md, "Sleep"): whether the engine sleeps and how deeply, its wake-ups
and how long they took, and the requests that arrived while it slept (each waited for a wake-up)."""
from prometheus_client import Counter, Gauge, Histogram

WAKE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
WAKE_CAUSES = ("request", "api")


class SleepMetrics:
    def __init__(self, registry, model_name: str):
        labels = ["model_name"]
        self.level = Gauge("kubeinfer_engine_sleep_level", "0 awake; 1 or 2: asleep at that level", labels,
                           registry=registry).labels(model_name)
        self.sleeps = Counter("kubeinfer_engine_sleeps", "Times the engine went to sleep", labels,
                              registry=registry).labels(model_name)
        wakeups = Counter("kubeinfer_engine_wakeups", "Wake-ups, by cause: a request that arrived, or /wake_up",
                          labels + ["cause"], registry=registry)
        self.wakeups = {cause: wakeups.labels(model_name, cause) for cause in WAKE_CAUSES}
        self.wake_seconds = Histogram("kubeinfer_engine_wake_seconds", "Seconds a wake-up took (weights and KV back)",
                                      labels, registry=registry, buckets=WAKE_BUCKETS).labels(model_name)
        self.waited = Counter("kubeinfer_requests_waited_for_wake", "Requests that arrived while the engine slept",
                              labels, registry=registry).labels(model_name)

    def slept(self, was: int, level: int) -> None:
        """The engine sleeps at `level`, from `was` (0: awake): a sleep that found it asleep (several asked at once,
        a deeper one) is not another one."""
        self.level.set(level)
        if not was:
            self.sleeps.inc()

    def woke(self, cause: str, figures: dict) -> None:
        self.level.set(0)
        if figures["level"]:   # a /wake_up of an engine already awake did nothing
            self.wakeups[cause].inc()
            self.wake_seconds.observe(figures["seconds"])
