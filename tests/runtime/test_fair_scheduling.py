"""The `fair` scheduling policy: weighted fair share of tokens between tenants, strict priority classes, and
preemption of lower classes; driven without a model (fake sampled tokens), then with one (outputs unchanged)."""
import random

import pytest

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams


def make(llama_dir, num_blocks=512, block_size=4, **settings):
    config = EngineConfig(model=str(llama_dir), block_size=block_size, scheduling_policy="fair", **settings)
    manager = BlockManager(num_blocks, block_size, config.max_num_seqs, config.max_blocks_per_seq, True, 0.0)
    return Scheduler(config, manager, (0,), config.max_model_len), manager


def request(name: str, tenant: str, prompt_len: int, max_tokens: int, weight: float = 1.0, priority: int = 0):
    prompt = [random.Random(name).randrange(1, 300) for _ in range(prompt_len)]
    return Sequence(name, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, tenant=tenant,
                                                 tenant_weight=weight, priority=priority))


def run(scheduler, steps: int) -> dict[str, int]:
    """Tokens computed per tenant over `steps` steps."""
    served: dict[str, int] = {}
    for _ in range(steps):
        batch = scheduler.schedule()
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            served[seq.params.tenant] = served.get(seq.params.tenant, 0) + n
        scheduler.postprocess(batch, [[7] if s.num_computed_tokens + n == s.num_tokens else []
                                      for s, n in zip(batch.seqs, batch.num_new_tokens)])
    return served


@pytest.mark.parametrize("weights, rates", [((1, 1), (10, 1)), ((3, 1), (10, 10))])
def test_tenants_get_tokens_in_proportion_to_their_weights_whatever_they_send(llama_dir, weights, rates):
    """A floods (10x B's requests, or both flood); two sequences run at a time, so the queue decides. Over the
    steps where both wait, computed tokens split as the weights, within 10%."""
    scheduler, _ = make(llama_dir, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(1000):
        for tenant, weight, rate in zip("AB", weights, rates):
            if i % (max(rates) // rate) == 0:   # B sends 1 for A's 10, or as many
                scheduler.add(request(f"{tenant}{i}", tenant, 24, 8, weight))
    served = run(scheduler, 300)
    assert scheduler.waiting and {s.params.tenant for s in scheduler.waiting} >= {"A", "B"}   # both still waited
    share = served["A"] / served["B"]
    assert share == pytest.approx(weights[0] / weights[1], rel=0.1), served


def test_long_prompts_do_not_buy_a_larger_share(llama_dir):
    """A sends few long prompts, B many short ones: tokens, not requests, are shared."""
    scheduler, _ = make(llama_dir, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(60):
        scheduler.add(request(f"A{i}", "A", 120, 4))
        for j in range(5):
            scheduler.add(request(f"B{i}-{j}", "B", 20, 4))
    served = run(scheduler, 300)
    assert served["A"] / served["B"] == pytest.approx(1.0, rel=0.15), served


def test_a_tenant_arriving_behind_a_flood_waits_at_most_one_admission(llama_dir):
    """No starvation: B's one request, behind 100 of A's, is the next admitted (its counter is lifted to the
    lowest waiting one, not left at 0, and a tenant that came back wins that tie once)."""
    scheduler, _ = make(llama_dir, max_num_seqs=1, max_num_batched_tokens=64)
    for i in range(100):
        scheduler.add(request(f"A{i}", "A", 16, 2))
    run(scheduler, 20)
    scheduler.add(request("B0", "B", 16, 2))
    admitted = []
    while "B0" not in admitted:
        batch = scheduler.schedule()
        admitted += [s.request_id for s in batch.seqs if s.request_id not in admitted]
        scheduler.postprocess(batch, [[7] if s.num_computed_tokens + n == s.num_tokens else []
                                      for s, n in zip(batch.seqs, batch.num_new_tokens)])
    assert admitted.index("B0") == 0, admitted   # the next admission: it came back at A's level, and wins the tie


def test_a_returning_tenant_banks_no_credit(llama_dir):
    """B was idle while A ran alone for a long time: when B comes back it shares from then on, it does not get
    all of the engine until it has caught up with A's tokens."""
    scheduler, _ = make(llama_dir, max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(200):
        scheduler.add(request(f"A{i}", "A", 24, 8))
    run(scheduler, 150)
    for i in range(100):
        scheduler.add(request(f"B{i}", "B", 24, 8))
    served = run(scheduler, 150)
    assert served["A"] / served["B"] == pytest.approx(1.0, rel=0.15), served


def test_a_higher_class_goes_first_and_preempts_lower_ones_when_the_pool_is_full(llama_dir):
    """Low-priority requests fill the KV pool; a high-priority one arrives: it starts at the next step, the newest
    low ones are preempted (recomputed later), and every block is free at the end."""
    scheduler, manager = make(llama_dir, num_blocks=24, max_num_seqs=8, max_num_batched_tokens=256)
    for i in range(6):
        scheduler.add(request(f"low{i}", "batch", 12, 40, priority=1))
    run(scheduler, 3)
    assert len(scheduler.running) == 6 and manager.num_free_blocks < 4
    urgent = request("urgent", "web", 16, 4, priority=0)
    scheduler.add(urgent)
    batch = scheduler.schedule()
    assert urgent in batch.seqs and scheduler.stats.num_preemptions >= 1
    assert all(s.params.priority == 1 for s in scheduler.waiting)
    scheduler.postprocess(batch, [[7] if s.num_computed_tokens + n == s.num_tokens else []
                                  for s, n in zip(batch.seqs, batch.num_new_tokens)])
    while scheduler.num_unfinished:
        run(scheduler, 1)
    assert urgent.is_finished and manager.num_free_blocks == manager.num_blocks


def test_without_priority_preemption_a_higher_class_waits_for_room_but_is_still_admitted_first(llama_dir):
    """The pool full of low-priority requests, two more of them waiting, then a high-priority one: it preempts no
    one (the step after it came runs without it), and once room frees it starts before the low ones that waited
    longer."""
    scheduler, manager = make(llama_dir, num_blocks=24, max_num_seqs=8, max_num_batched_tokens=256,
                              priority_preemption=False)
    for i in range(6):
        scheduler.add(request(f"low{i}", "batch", 12, 40, priority=1))
    run(scheduler, 3)
    assert len(scheduler.running) == 6 and manager.num_free_blocks < 4
    late = [request(f"late{i}", "batch", 12, 4, priority=1) for i in range(2)]
    for seq in late:
        scheduler.add(seq)
    urgent = request("urgent", "web", 16, 4, priority=0)
    scheduler.add(urgent)
    preempted = scheduler.stats.num_preemptions
    run(scheduler, 1)
    assert urgent.num_computed_tokens == 0 and scheduler.stats.num_preemptions == preempted
    started = {}
    for step in range(400):
        run(scheduler, 1)
        for seq in (urgent, *late):
            if seq.num_computed_tokens or seq.is_finished:
                started.setdefault(seq.request_id, step)
        if not scheduler.num_unfinished:
            break
    assert started["urgent"] <= min(started["late0"], started["late1"]), started
    assert urgent.is_finished and manager.num_free_blocks == manager.num_blocks


def test_greedy_outputs_do_not_depend_on_tenants_priorities_or_preemption(llama_dir):
    """The same prompts under fcfs and under fair with tenants, weights, priorities and a pool small enough to
    preempt: every request's greedy tokens are the same."""
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randrange(8, 60))] for _ in range(12)]
    reference = LLM(str(llama_dir), max_num_seqs=4, num_kvcache_blocks=24, block_size=4).generate(
        prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    fair = LLM(str(llama_dir), max_num_seqs=4, num_kvcache_blocks=24, block_size=4, scheduling_policy="fair")
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, tenant="AB"[i % 2],
                             tenant_weight=1 + i % 3, priority=i % 2) for i in range(12)]
    outputs = fair.generate(prompts, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    assert fair.engine.scheduler.stats.num_preemptions > 0
    assert fair.engine.block_manager.num_free_blocks == fair.engine.block_manager.num_blocks


def admitted(scheduler) -> set[str]:
    return {s.request_id for s in scheduler.running}


@pytest.mark.parametrize("priority_preemption", [True, False])
@pytest.mark.parametrize("weight_a, b_slots", [(1, 2), (3, 1)])
def test_a_tenant_below_its_share_of_the_running_set_takes_the_place_of_the_tenant_furthest_ahead(
        llama_dir, priority_preemption, weight_a, b_slots):
    """The running set (4) is full of A's long requests; B's share of it is 4 x 1 / (1 + A's weight) slots. B's
    first request starts at the next step (A's newest gives way and is recomputed later); while B holds fewer than
    its share, its next request takes another A's place as soon as the token counters make it next, B0 still
    running; once B holds its share, the next one waits. Within a class: the same without priority preemption."""
    scheduler, manager = make(llama_dir, max_num_seqs=4, max_num_batched_tokens=256,
                              priority_preemption=priority_preemption)
    for i in range(8):
        scheduler.add(request(f"A{i}", "A", 16, 200, weight=weight_a))
    run(scheduler, 5)
    assert admitted(scheduler) == {"A0", "A1", "A2", "A3"}
    for i in range(3):
        scheduler.add(request(f"B{i}", "B", 16, 40))
    batch = scheduler.schedule()
    assert [s.request_id for s in batch.seqs if s.params.tenant == "B"] == ["B0"]
    assert scheduler.stats.num_preemptions == 1 and "A3" in {s.request_id for s in scheduler.waiting}
    scheduler.postprocess(batch, [[7] if s.num_computed_tokens + n == s.num_tokens else []
                                  for s, n in zip(batch.seqs, batch.num_new_tokens)])
    for _ in range(30):   # B's counter passed A's with B0's prompt; A catches up within ~16 tokens / 2 per step
        run(scheduler, 1)
    assert "B0" in admitted(scheduler)
    assert {"B0", "B1", "B2"} & admitted(scheduler) == {f"B{i}" for i in range(b_slots)}
    assert scheduler.stats.num_preemptions == b_slots
    while scheduler.num_unfinished:
        run(scheduler, 1)
    assert manager.num_free_blocks == manager.num_blocks


def test_a_small_tenant_is_not_held_back_by_its_own_last_prompt(llama_dir):
    """B sends a long prompt, then another while the first still decodes. B came back with up to one step's
    budget of credit (256 tokens), so its 100-token prompt leaves it behind A still: B1 starts at the next step
    (taking an A's place, B holding 1 of its 2 slots), not once A has decoded as many tokens as B0's prompt held
    (~35 steps at 3 of A's tokens a step)."""
    scheduler, manager = make(llama_dir, max_num_seqs=4, max_num_batched_tokens=256)
    for i in range(8):
        scheduler.add(request(f"A{i}", "A", 16, 200))
    run(scheduler, 150)   # A's counter: ~660, well over the credit
    scheduler.add(request("B0", "B", 100, 40))
    run(scheduler, 2)
    assert "B0" in admitted(scheduler)
    scheduler.add(request("B1", "B", 100, 40))
    run(scheduler, 1)
    assert {"B0", "B1"} <= admitted(scheduler)
    assert scheduler.waiting.counters["B"] < scheduler.waiting.counters["A"]
    while scheduler.num_unfinished:
        run(scheduler, 1)
    assert manager.num_free_blocks == manager.num_blocks


def test_the_step_that_starts_a_favoured_sequence_leaves_other_tenants_prompt_chunks_for_the_next(llama_dir):
    """A's 3 requests decode and C's long prompt is mid-prefill when B's first request arrives: A's newest gives way
    to B, and in that step C's next chunk waits (B's first token comes after its own prompt and the decodes only);
    C's prompt goes on at the next step."""
    scheduler, manager = make(llama_dir, max_num_seqs=4, max_num_batched_tokens=64)
    for i in range(3):
        scheduler.add(request(f"A{i}", "A", 16, 200))
    run(scheduler, 40)   # A's counter (~170) passes what C's first chunks will give C
    scheduler.add(request("C0", "C", 300, 10))
    for i in range(3, 8):
        scheduler.add(request(f"A{i}", "A", 16, 200))
    run(scheduler, 2)
    c0 = next(s for s in scheduler.running if s.request_id == "C0")
    assert 0 < c0.num_computed_tokens < 300
    scheduler.add(request("B0", "B", 16, 10))
    batch = scheduler.schedule()
    scheduled = dict(zip((s.request_id for s in batch.seqs), batch.num_new_tokens))
    assert scheduled.get("B0") == 16 and "C0" not in scheduled, scheduled
    assert scheduler.stats.num_preemptions == 1 and "C0" in admitted(scheduler)
    scheduler.postprocess(batch, [[7] if s.num_computed_tokens + n == s.num_tokens else []
                                  for s, n in zip(batch.seqs, batch.num_new_tokens)])
    batch = scheduler.schedule()
    assert "C0" in {s.request_id for s in batch.seqs}
    scheduler.postprocess(batch, [[7] if s.num_computed_tokens + n == s.num_tokens else []
                                  for s, n in zip(batch.seqs, batch.num_new_tokens)])
    while scheduler.num_unfinished:
        run(scheduler, 1)
    assert manager.num_free_blocks == manager.num_blocks


def test_recomputing_a_preempted_sequence_is_not_charged_to_its_tenant():
    from kubeinfer.runtime.engine.waiting_queue import FairQueue
    queue, seq = FairQueue(), request("A0", "A", 200, 10, weight=2)
    queue.charge([seq], [120])                        # its first chunk: 120 tokens, weight 2
    seq.num_computed_tokens = 120
    assert queue.counters["A"] == 60
    seq.num_computed_tokens = 16                      # preempted; 16 tokens back from the prefix cache
    queue.charge([seq], [100])                        # recomputed 16..116: all charged before
    seq.num_computed_tokens = 116
    queue.charge([seq], [84])                         # 116..200: only 120..200 is new
    assert queue.counters["A"] == 60 + 80 / 2
