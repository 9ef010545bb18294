"""Request traces from CSV files (`TIMESTAMP,ContextTokens,GeneratedTokens`) in the autoscaling simulator: parsed
as production traces write them, replayed request by request with their own lengths, compressed or scaled; and
fleets sized on a trace's own requests, so that the limit and the peak-sized fleet stay bounds on it."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

from kubeinfer.operator.autoscaling.simulator.policies import FixedFleet
from kubeinfer.operator.autoscaling.simulator.scenarios import replicas_for_rate, summarize
from kubeinfer.operator.autoscaling.simulator.sim import ReplicaModel, Simulation, generate_requests
from kubeinfer.operator.autoscaling.simulator.trace_file import load_trace, read_requests
from kubeinfer.operator.autoscaling.sizing.fleet_sizing import attainable_share, sizing_share

MODEL = ReplicaModel(cold_start_s=30.0)
AZURE_STYLE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2000000,879,7
2023-11-16 18:16:46.6805900,1200,2
"""


def test_reads_production_timestamps_and_keeps_each_requests_lengths(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_STYLE)
    requests = read_requests(path)
    assert [(round(t, 4), p, o) for t, p, o in requests] == [(0.0, 374, 44), (4.3146, 396, 109),
                                                           (4.5194, 879, 7), (60.0, 1200, 2)]
    trace = load_trace(path)
    assert [(r.prompt, r.output) for r in generate_requests(trace, seed=0)] == [(374, 44), (396, 109), (879, 7)]
    assert trace.duration_s == 60   # the last request arrives at the end: replayed up to it


def test_numeric_timestamps_compression_and_rate_scaling(tmp_path):
    path = tmp_path / "numeric.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{i * 2.0},{100 + i},{10}\n"
                                                                          for i in range(1000)))
    plain = load_trace(path)
    assert len(plain.requests) == 1000 and plain.peak_rate == pytest.approx(0.5, abs=0.05)
    fast = load_trace(path, compress_to_s=999.0)
    assert fast.duration_s == 999 and fast.peak_rate == pytest.approx(1.0, abs=0.1)
    assert [p for _, p, _ in fast.requests] == [p for _, p, _ in plain.requests]
    doubled, halved = load_trace(path, rate_scale=2.0), load_trace(path, rate_scale=0.5, seed=3)
    assert len(doubled.requests) == 2000 and 400 < len(halved.requests) < 600


def test_bad_files_say_what_is_wrong(tmp_path):
    (tmp_path / "cols.csv").write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(ValueError, match="missing column"):
        read_requests(tmp_path / "cols.csv")
    (tmp_path / "value.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1,many,3\n")
    with pytest.raises(ValueError, match="value.csv:2"):
        read_requests(tmp_path / "value.csv")


def test_fleets_are_sized_on_the_traces_own_requests():
    """The bundled conversation trace's prompts are twice the simulator's default: the same rate needs more
    replicas, and a fleet sized so holds the trace's attainable share on a steady load of its requests."""
    trace = load_trace(BENCHMARKS / "autoscale" / "traces" / "bursty_conversation.csv")
    attainable = attainable_share(trace.lengths, 0.5, MODEL)
    assert 0.9 < attainable < 1.0   # some prompts alone take longer than the target to prefill
    share = sizing_share(trace.lengths, 0.5, MODEL)
    default = replicas_for_rate(4.0, 0.5, MODEL)
    own = replicas_for_rate(4.0, 0.5, MODEL, share, lengths=trace.lengths)
    assert own > default
    from kubeinfer.operator.autoscaling.simulator.scenarios import calibration_run
    sim = Simulation(calibration_run(4.0, trace.lengths), FixedFleet(own), own, MODEL, seed=11).run()
    assert summarize(sim, 0.5, warmup_s=0).slo_share >= share - 0.01
