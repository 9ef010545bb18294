"""What the autoscaling policy keeps from each observation in its history, and what it learns from them: the
queue samples of one metric window (the arrival rate and the queue's growth), when the ready count last
changed, and what one replica does when saturated (its running batch and its throughput). Pure functions
of (history, signals, counts, config) returning the next history; `policy.decide` calls them.
"""

from __future__ import annotations

from dataclasses import replace

from kubeinfer.operator.autoscaling.policies.types import PolicyConfig, ScaleHistory
from kubeinfer.operator.autoscaling.signals.measured import ReplicaCounts, Signals


def observe_queue(hist: ScaleHistory, signals: Signals, replicas: ReplicaCounts,
                   config: PolicyConfig) -> ScaleHistory:
    """Keep (signal time, waiting, running, ready) for one metric window; a repeated signal is not a new
    sample."""
    samples = hist.queue_samples
    if samples and samples[-1][0] >= signals.timestamp:
        return hist
    oldest = signals.timestamp - config.metric_window_seconds
    kept = tuple(s for s in samples if s[0] >= oldest)
    sample = (signals.timestamp, signals.queue_depth or 0.0, signals.num_running or 0.0, replicas.ready)
    return replace(hist, queue_samples=kept + (sample,))


def _queue_change_per_second(first: tuple, last: tuple) -> float:
    """Waiting requests added per second from one queue sample to a later one."""
    return (last[1] - first[1]) / (last[0] - first[0])


def queue_growth(hist: ScaleHistory) -> float:
    """Waiting requests added per second between the last two samples (0 with fewer than two)."""
    if len(hist.queue_samples) < 2:
        return 0.0
    return _queue_change_per_second(*hist.queue_samples[-2:])


def arrival_rate(hist: ScaleHistory, signals: Signals) -> float:
    """Requests arriving per second over the window: those admitted (first tokens) plus the queue's change."""
    served = signals.request_rate or 0.0
    if len(hist.queue_samples) < 2:
        return served
    return max(0.0, served + _queue_change_per_second(hist.queue_samples[0], hist.queue_samples[-1]))


# A window in which the replicas ran at least this share of their batch capacity (or queued) on average
# measures their throughput close enough to saturation (it can only underestimate it).
BUSY_TO_MEASURE = 0.75
# ... provided its queue samples span at least this share of the metric window.
SAMPLES_SPAN_TO_MEASURE = 0.75


def learn_capacity(hist: ScaleHistory, signals: Signals, replicas: ReplicaCounts,
                    config: PolicyConfig) -> ScaleHistory:
    """Learn what one replica does when saturated, keeping the highest seen:
    - the running batch, when the queue is at its target on a fully ready fleet (a request waiting for
      the next engine step is not saturation; a loading replica runs nothing);
    - the throughput, when the samples of (nearly) a whole window were busy on average (see
      BUSY_TO_MEASURE) with the same ready count: first tokens per second over the window per ready
      replica. A replica that just became ready fills its whole batch in one step, so windows in which
      the count changed are not used."""
    target = config.target_queue_depth_per_replica * (1 - config.tolerance)
    ready, waiting = replicas.ready, signals.queue_depth or 0.0
    if ready > 0 and replicas.pending == 0 and signals.num_running and waiting >= target * ready:
        hist = replace(hist, capacity_per_replica=max(signals.num_running / ready, hist.capacity_per_replica or 0.0))
    window = config.metric_window_seconds
    samples = [s for s in hist.queue_samples if s[0] > signals.timestamp - window]
    capacity = hist.capacity_per_replica
    if not (capacity and signals.request_rate and len(samples) >= 2
            and samples[-1][0] - samples[0][0] >= SAMPLES_SPAN_TO_MEASURE * window
            and len({r for *_, r in samples}) == 1 and samples[0][3] > 0):
        return hist
    ready_then = samples[0][3]
    busy = sum(min(1.0, n / (capacity * ready_then)) if q < target * ready_then else 1.0
               for _, q, n, _ in samples) / len(samples)
    measured = signals.request_rate / ready_then
    if busy >= BUSY_TO_MEASURE and measured > (hist.throughput_per_replica or 0.0):
        hist = replace(hist, throughput_per_replica=measured)
    return hist


def saturation_throughput(hist: ScaleHistory, config: PolicyConfig) -> float | None:
    """Requests per second one replica serves saturated, as the policy sizes with it: the measured throughput
    raises the spec's `throughputPerReplica`, never lowers it. A window counts as saturated when it is at least
    BUSY_TO_MEASURE busy, so a measured completion rate is a lower bound of the capacity; put in place of a given
    value it made every fleet sized from it too large (issue #28: 73 of 136 drain-rule scale-ups sized at 1.33-1.88
    req/s a replica against the real 2). Without a given value, the measured one (None until measured)."""
    given, measured = config.assumed_throughput_per_replica, hist.throughput_per_replica
    if given is None or measured is None:
        return measured or given
    return max(given, measured)


def overloaded_in_window(hist: ScaleHistory, config: PolicyConfig) -> bool:
    """Whether any queue sample of the window was above its band."""
    limit = config.target_queue_depth_per_replica * (1 + config.tolerance)
    return any(q > limit * max(r, 1) for _, q, _, r in hist.queue_samples)


def observe_ready(hist: ScaleHistory, replicas: ReplicaCounts, now: float) -> ScaleHistory:
    if hist.last_ready == replicas.ready:
        return hist
    return replace(hist, last_ready=replicas.ready, ready_changed_at=now)

