"""torch's CPU threads follow the container's CPU limit (cgroup quota), not the node's core count."""
import os

from kubeinfer.runtime.cpu_threads import cgroup_cpu_limit, cpu_threads


def test_cgroup_v2_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 2.5
    assert cpu_threads(tmp_path) == min(3, len(os.sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("25000 100000\n")   # 250m: still one thread
    assert cpu_threads(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None and cpu_threads(tmp_path) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_no_cgroup_files(tmp_path):
    assert cgroup_cpu_limit(tmp_path) is None and cpu_threads(tmp_path) == len(os.sched_getaffinity(0))


def test_an_explicit_thread_count_wins(monkeypatch):
    import torch

    from kubeinfer.runtime.cpu_threads import configure_torch_threads
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    try:
        assert configure_torch_threads() is None and torch.get_num_threads() == before   # OMP_NUM_THREADS decides
        assert configure_torch_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
