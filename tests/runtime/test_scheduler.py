"""Scheduling rules, driven without a model: fake sampled tokens feed postprocess."""
from dataclasses import replace

import pytest
import torch

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.step_inputs import build_step_inputs
from kubeinfer.runtime.engine.sequence import Sequence, SequenceStatus
from kubeinfer.runtime.sampling_params import SamplingParams


def make(llama_dir, num_blocks=64, block_size=4, **settings):
    config = EngineConfig(model=str(llama_dir), block_size=block_size, **settings)
    manager = BlockManager(num_blocks, block_size, config.max_num_seqs, config.max_blocks_per_seq, True, 0.0)
    return Scheduler(config, manager, (0,), config.max_model_len), manager


def step(scheduler):
    batch = scheduler.schedule()
    sampled = [[7] if seq.num_computed_tokens + n == seq.num_tokens else []
               for seq, n in zip(batch.seqs, batch.num_new_tokens)]
    scheduler.postprocess(batch, sampled)
    return batch


def test_budget_is_respected_and_prefill_is_chunked_alongside_decode(llama_dir):
    scheduler, _ = make(llama_dir, max_num_batched_tokens=10)
    first = Sequence("a", [1] * 6, SamplingParams(max_tokens=5))
    second = Sequence("b", [2] * 25, SamplingParams(max_tokens=5))
    scheduler.add(first)
    scheduler.add(second)
    batch = step(scheduler)
    assert batch.num_new_tokens == [6, 4]                  # a whole, b's first chunk
    batch = step(scheduler)
    assert [s.request_id for s in batch.seqs] == ["a", "b"] and batch.num_new_tokens == [1, 9]
    batch = step(scheduler)
    assert batch.num_new_tokens == [1, 9]                  # a decodes, b takes its third chunk
    while scheduler.num_unfinished:
        assert step(scheduler).num_tokens <= 10


def test_max_num_seqs_limits_the_running_set(llama_dir):
    scheduler, _ = make(llama_dir, max_num_seqs=2)
    for i in range(5):
        scheduler.add(Sequence(str(i), [1, 2, 3], SamplingParams(max_tokens=3)))
    batch = step(scheduler)
    assert len(batch) == 2 and len(scheduler.waiting) == 3


def test_preempted_sequence_returns_to_the_front_of_the_queue(llama_dir):
    scheduler, manager = make(llama_dir, num_blocks=4, block_size=4)
    old = Sequence("old", [1] * 8, SamplingParams(max_tokens=20, ignore_eos=True))
    new = Sequence("new", [2] * 8, SamplingParams(max_tokens=20, ignore_eos=True))
    later = Sequence("later", [3] * 3, SamplingParams(max_tokens=2))
    for seq in (old, new, later):
        scheduler.add(seq)
    step(scheduler)   # old and new take 2 blocks each: the pool is full; later waits
    assert [s.request_id for s in scheduler.running] == ["old", "new"]
    step(scheduler)   # old grows to a third block: new, the newest, is preempted
    assert [s.request_id for s in scheduler.waiting] == ["new", "later"]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0 and not new.block_table
    assert new.output_token_ids == [7] and scheduler.stats.num_preemptions == 1


def test_shortest_first_starts_a_burst_shortest_prompt_first_and_fcfs_in_arrival_order(llama_dir):
    lengths = {"a": 30, "b": 5, "c": 20, "d": 10}
    for policy, expected in (("shortest-first", ["b", "d", "c", "a"]), ("fcfs", ["a", "b", "c", "d"])):
        scheduler, _ = make(llama_dir, num_blocks=64, max_num_batched_tokens=100, scheduling_policy=policy)
        for name, length in lengths.items():
            scheduler.add(Sequence(name, [1] * length, SamplingParams(max_tokens=2), arrival_time=100.0))
        assert [s.request_id for s in scheduler.schedule().seqs] == expected, policy


def test_a_long_prompt_is_passed_only_by_prompts_arriving_within_its_own_prefill_time(llama_dir):
    scheduler, _ = make(llama_dir, scheduling_policy="shortest-first")
    scheduler.prefill_rate = 400.0   # tokens/s: the 400-token prompt's own prefill takes 1 s
    arrivals = [("long", 400, 10.0), ("within", 40, 10.5), ("after", 40, 10.95), ("later", 4, 11.5)]
    for name, length, arrival in arrivals:
        scheduler.add(Sequence(name, [1] * length, SamplingParams(max_tokens=2), arrival_time=arrival))
    # keys: long 11.0, within 10.6, after 11.05, later 11.51
    assert [s.request_id for s in scheduler.waiting] == ["within", "long", "after", "later"]


def test_shortest_first_still_puts_a_preempted_sequence_ahead_of_shorter_waiting_ones(llama_dir):
    scheduler, _ = make(llama_dir, num_blocks=4, block_size=4, scheduling_policy="shortest-first")
    old = Sequence("old", [1] * 8, SamplingParams(max_tokens=20, ignore_eos=True))
    new = Sequence("new", [2] * 8, SamplingParams(max_tokens=20, ignore_eos=True))
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)   # both run, the pool is full
    scheduler.add(Sequence("later", [3] * 3, SamplingParams(max_tokens=2)))
    step(scheduler)   # old grows to a third block: new is preempted, ahead of the shorter one waiting
    assert [s.request_id for s in scheduler.waiting] == ["new", "later"]
    assert scheduler.stats.num_preemptions == 1


def test_the_prefill_rate_is_learnt_from_steps_of_at_least_half_the_budget(llama_dir):
    scheduler, _ = make(llama_dir, max_num_batched_tokens=1000, scheduling_policy="shortest-first")
    scheduler.observe_step(400, 0.01)   # a decode-sized step: not a prefill rate
    assert scheduler.prefill_rate is None
    scheduler.observe_step(1000, 0.5)
    assert scheduler.prefill_rate == 2000.0
    scheduler.observe_step(600, 0.1)    # 6,000 tokens/s, weighted into the moving average
    assert abs(scheduler.prefill_rate - (2000 + 0.2 * 4000)) < 1e-9


def test_an_unknown_scheduling_policy_is_refused_in_one_line(llama_dir):
    with pytest.raises(ConfigError, match="scheduling_policy must be one of fcfs, shortest-first, fair, got 'lifo'"):
        EngineConfig(model=str(llama_dir), scheduling_policy="lifo")


def run_random_workload(llama_dir, bulk_decodes: bool, seed: int) -> list:
    """Every step's decisions and, at the end, every sequence's tokens, reasons and the pool, for a random workload:
    arrivals over time, shared prefixes, stop tokens, min/max tokens, a model length that cuts some, and a pool
    small enough to preempt. `bulk_decodes` False forces the per-sequence loop everywhere."""
    import random
    rng = random.Random(seed)
    scheduler, manager = make(llama_dir, num_blocks=24, block_size=4, max_num_seqs=8, max_num_batched_tokens=24,
                              max_model_len=48)
    if not bulk_decodes:
        scheduler.bulk_decodes = False
    shared = [rng.randrange(1, 50) for _ in range(8)]
    seqs, trace = [], []
    for step_index in range(400):
        if step_index < 150 and rng.random() < 0.4:
            prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 14))]
            max_tokens = rng.randrange(1, 45)
            params = SamplingParams(max_tokens=max_tokens, min_tokens=rng.randrange(0, min(3, max_tokens + 1)),
                                    stop_token_ids=[rng.randrange(1, 50)], ignore_eos=rng.random() < 0.5)
            seqs.append(Sequence(str(len(seqs)), prompt, params))
            scheduler.add(seqs[-1])
        if not scheduler.num_unfinished:
            continue
        batch = scheduler.schedule()
        if batch.num_decodes:   # the step's inputs built in bulk equal those built sequence by sequence
            bulk, loop = (build_step_inputs(b, manager, 4).astuple() for b in (batch, replace(batch, num_decodes=0)))
            assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(bulk, loop))
        sampled = [[rng.randrange(0, 50)] if seq.num_computed_tokens + n == seq.num_tokens else []
                   for seq, n in zip(batch.seqs, batch.num_new_tokens)]
        kept = scheduler.postprocess(batch, sampled)
        trace.append((batch.num_decodes > 0, [s.request_id for s in batch.seqs], batch.num_new_tokens, kept,
                      [s.request_id for s in scheduler.waiting], manager.num_free_blocks))
    assert not scheduler.num_unfinished
    trace.append([(s.token_ids, s.finish_reason, s.stop_reason, s.num_preemptions, s.num_cached_tokens) for s in seqs])
    trace.append((manager.num_free_blocks, sorted(manager.cached.items(), key=repr), scheduler.stats))
    return trace


@pytest.mark.parametrize("seed", range(3))
def test_bulk_decode_steps_decide_exactly_as_the_per_sequence_loop(llama_dir, seed):
    bulk, loop = run_random_workload(llama_dir, True, seed), run_random_workload(llama_dir, False, seed)
    assert sum(step[0] for step in bulk[:-2]) > 50 and not any(step[0] for step in loop[:-2])
    assert [step[1:] for step in bulk[:-2]] == [step[1:] for step in loop[:-2]] and bulk[-2:] == loop[-2:]
    assert sum(s[3] for s in bulk[-2]) > 0   # the pool was small enough to preempt
