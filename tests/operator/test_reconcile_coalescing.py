"""Children's events fold into one waiting pass per InferenceService (reconcile_soon), with real threads as
kopf's executor runs handlers; a fake API that blocks the first read holds a pass in flight."""
import threading

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile.controller import Context, reconcile_named, reconcile_soon
from support import wait_for


class BlockingKube:
    """Counts reads of the InferenceService; the first waits for `release`. The object is gone (None), so a
    pass ends right after its read."""

    def __init__(self):
        self.reads, self.release, self.first_read = 0, threading.Event(), threading.Event()
        self._lock = threading.Lock()

    def get(self, path: str):
        with self._lock:
            self.reads += 1
            first = self.reads == 1
        if first:
            self.first_read.set()
            assert self.release.wait(10)
        return None


def context(kube) -> Context:
    return Context(kube=kube, config=OperatorConfig(), with_service_monitor=False)


def start(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args)
    thread.start()
    return thread


def test_events_during_a_pass_make_one_more_pass_not_one_each():
    kube = BlockingKube()
    ctx = context(kube)
    running = start(reconcile_soon, ctx, "default", "qwen")
    assert kube.first_read.wait(10)
    waiting = start(reconcile_soon, ctx, "default", "qwen")   # queues behind the running pass
    wait_for(lambda: ("default", "qwen") in ctx._queued, 10, "the second pass to queue", 0.001)
    for _ in range(10):   # covered by the waiting pass: they return at once, while the first still runs
        reconcile_soon(ctx, "default", "qwen")
    other = start(reconcile_soon, ctx, "default", "other")   # another object is not folded in
    other.join(10)
    assert kube.reads == 2
    kube.release.set()
    for thread in (running, waiting):
        thread.join(10)
    assert kube.reads == 3   # the first pass, one more for the eleven events, and the other object's
    reconcile_soon(ctx, "default", "qwen")   # nothing in flight: an event runs its own pass
    assert kube.reads == 4 and not ctx._queued


def test_handler_passes_are_never_folded():
    kube = BlockingKube()
    ctx = context(kube)
    running = start(reconcile_soon, ctx, "default", "qwen")
    assert kube.first_read.wait(10)
    handlers = [start(reconcile_named, ctx, "default", "qwen") for _ in range(3)]   # create/update/resume
    kube.release.set()
    for thread in (running, *handlers):
        thread.join(10)
    assert kube.reads == 4
