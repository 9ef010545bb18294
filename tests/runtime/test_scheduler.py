"""Scheduling rules, driven without a model: fake sampled tokens feed postprocess."""
from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.sequence import Sequence, SequenceStatus
from kubeinfer.runtime.sampling_params import SamplingParams


def make(llama_dir, num_blocks=64, block_size=4, **settings):
    config = EngineConfig(model=str(llama_dir), block_size=block_size, **settings)
    manager = BlockManager(num_blocks, block_size, config.max_num_seqs, config.max_blocks_per_seq, True, 0.0)
    return Scheduler(config, manager, eos_token_ids=(0,)), manager


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
