"""The series the operator's predictive autoscaler calibrates its replica model from: the step moments (sums of a
step's decoding sequences n, prefill tokens p and seconds t, and their products) and the tokens per request."""
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest

from kubeinfer.runtime.engine.core import step_composition
from kubeinfer.runtime.engine.scheduler import ScheduledBatch
from kubeinfer.runtime.engine.messages import EngineStats
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.server.metrics import EngineMetrics


def samples(metrics: EngineMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            key = (s.name, s.labels.get("moment") or s.labels.get("le"))
            out[key] = s.value
    return out


def stats(decodes: int, prefill: int) -> EngineStats:
    return EngineStats(decodes, 0, 0.1, 0, 0, 0, step_decodes=decodes, step_prefill_tokens=prefill)


def test_each_step_adds_its_moments_and_a_step_without_time_adds_none():
    m = EngineMetrics("tiny")
    m.observe_stats(stats(3, 100), 0.05)
    m.observe_stats(stats(5, 0), 0.02)
    m.observe_stats(stats(7, 900), None)   # no step ran (aborts): not a step
    got = samples(m)
    moment = {name: got[("kubeinfer_engine_step_moments_total", name)] for name in ("n", "p", "nn", "np", "pp", "nt", "pt")}
    assert moment == pytest.approx({"n": 8, "p": 100, "nn": 34, "np": 300, "pp": 10_000, "nt": 0.25, "pt": 5.0})
    assert got[("kubeinfer_engine_step_seconds_count", None)] == 2
    assert got[("kubeinfer_engine_step_seconds_sum", None)] == pytest.approx(0.07)


def output(finished: bool, tokens: int, prompt: int, first: bool) -> RequestOutput:
    return RequestOutput("r1", list(range(prompt)), list(range(tokens)), "", [0] if first or finished else [], "", [],
                         [], finished, "length" if finished else None, None, 0, 0.0, 0.01)


def test_a_request_counts_its_prompt_at_the_first_token_and_its_output_when_it_finishes():
    m = EngineMetrics("tiny")
    m.record_output(output(False, 1, 300, first=True), 0.1)
    got = samples(m)
    assert got[("kubeinfer_request_prompt_tokens_bucket", "256.0")] == 0
    assert got[("kubeinfer_request_prompt_tokens_bucket", "384.0")] == 1
    assert got[("kubeinfer_request_generation_tokens_count", None)] == 0
    m.record_output(output(True, 20, 300, first=False), 0.3)
    got = samples(m)
    assert got[("kubeinfer_request_prompt_tokens_count", None)] == 1
    assert got[("kubeinfer_request_generation_tokens_bucket", "16.0")] == 0
    assert got[("kubeinfer_request_generation_tokens_bucket", "24.0")] == 1
    assert got[("kubeinfer_request_generation_tokens_sum", None)] == 20


def test_a_steps_composition_counts_decodes_with_their_drafts_and_prefill_chunks():
    seq = lambda drafts=0: SimpleNamespace(draft_token_ids=[0] * drafts)   # noqa: E731
    batch = ScheduledBatch(seqs=[seq(), seq(), seq(3), seq(), seq()], num_new_tokens=[1, 1, 4, 512, 37])
    assert step_composition(batch) == (3, 549)
    batch.num_decodes = 2   # the same two decodes, scheduled by the bulk path: counted without a look
    assert step_composition(batch) == (3, 549)
    assert step_composition(ScheduledBatch()) == (0, 0)


def test_the_engine_reports_each_steps_composition_in_its_stats(llama_dir):
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    llm = LLM(str(llama_dir), max_model_len=128, enable_prefix_caching=False)
    core = llm.engine.core
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0)
    core.add("a", [5] * 20, params)
    core.step()
    assert (core.stats().step_decodes, core.stats().step_prefill_tokens) == (0, 20)
    core.add("b", [6] * 9, params)
    core.step()   # a's decode beside b's prefill
    assert (core.stats().step_decodes, core.stats().step_prefill_tokens) == (1, 9)
    core.step()
    assert (core.stats().step_decodes, core.stats().step_prefill_tokens) == (2, 0)
