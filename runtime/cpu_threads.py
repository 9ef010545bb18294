"""How many threads torch should use on CPU: the CPUs this process may really run on.

In a container with a CPU limit, torch's default (every core of the node) oversubscribes the limit: the
kernel throttles the container each period and every parallel op waits at its barrier for throttled
threads. The limit is the cgroup's quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`),
rounded up, and never more than the CPUs of this process's affinity mask. OMP_NUM_THREADS, when set, wins.
"""
import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup quota allows (e.g. 0.25 for 250m), or None when there is no quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cpu_threads(root: Path = CGROUP) -> int:
    cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(root)
    return max(1, min(cores, math.ceil(limit))) if limit is not None else cores


def configure_torch_threads(threads: int | None = None) -> int | None:
    """Sets torch's intra-op threads to `threads`, or else to `cpu_threads()` unless OMP_NUM_THREADS is set;
    returns what was set (None: OMP_NUM_THREADS decides)."""
    if threads is None and "OMP_NUM_THREADS" in os.environ:
        return None
    import torch
    threads = threads or cpu_threads()
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return threads
