"""The estimated cost per tenant: each engine step's time shared out by the tokens each tenant computed in it
(`kubeinfer_tenant_busy_seconds_total`); the shares add up to the engine's busy time."""
import random

import pytest

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.messages import EngineStats
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.scheduler_stats import TenantTokens
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.metrics import EngineMetrics

TENANTS = ("", "alpha", "beta", "gamma")


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_a_batchs_tokens_by_tenant_are_what_its_sequences_compute(llama_dir, policy):
    """A random workload of prompts arriving while others decode: steps of decodes only (the bulk path), of
    prefill chunks only, and mixed; the counts are each tenant's sum of the batch's new tokens (the remembered count
    of the decodes included, as the running set changes)."""
    rng = random.Random(5)
    config = EngineConfig(model=str(llama_dir), block_size=4, max_num_seqs=6, max_num_batched_tokens=24,
                          scheduling_policy=policy)
    manager = BlockManager(200, 4, config.max_num_seqs, config.max_blocks_per_seq, True, 0.0)
    scheduler = Scheduler(config, manager, (0,), config.max_model_len)
    kinds, tenant_tokens = set(), TenantTokens()
    for step in range(300):
        if rng.random() < 0.3:
            scheduler.add(Sequence(f"r{step}", [rng.randrange(1, 200) for _ in range(rng.randrange(1, 40))],
                                   SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=True,
                                                  tenant=rng.choice(TENANTS), priority=rng.randrange(2))))
        batch = scheduler.schedule()
        expected: dict[str, int] = {}
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            expected[seq.params.tenant] = expected.get(seq.params.tenant, 0) + num_new
        assert tenant_tokens.count(batch) == expected
        kinds.add((batch.num_decodes > 0, batch.num_decodes < len(batch)))
        scheduler.postprocess(batch, [[rng.randrange(1, 200)] if s.num_computed_tokens + n == s.num_tokens else []
                                      for s, n in zip(batch.seqs, batch.num_new_tokens)])
    assert {(True, False), (False, True)} <= kinds   # bulk decode steps and prefill steps both ran


def _value(metrics: EngineMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels}) or 0.0


def test_each_steps_time_is_shared_by_tokens_and_the_shares_add_up_to_the_busy_time():
    metrics = EngineMetrics("m", vllm_names=False)
    metrics.add_tenants(["alpha", "beta", "anonymous"])
    stats = EngineStats(0, 0, 0.0, 0, 0, 0)
    metrics.observe_stats(stats, 0.4, {"alpha": 3, "": 1})
    assert _value(metrics, "kubeinfer_tenant_busy_seconds_total", tenant="alpha") == pytest.approx(0.3)
    assert _value(metrics, "kubeinfer_tenant_busy_seconds_total", tenant="anonymous") == pytest.approx(0.1)
    assert _value(metrics, "kubeinfer_tenant_busy_seconds_total", tenant="beta") == 0
    metrics.observe_stats(stats, None, {})   # no step ran (aborts): no time to share
    rng = random.Random(1)
    for _ in range(1000):
        tokens = {t: rng.randrange(1, 300) for t in rng.sample(("alpha", "beta", ""), rng.randrange(1, 4))}
        metrics.observe_stats(stats, rng.uniform(0.001, 0.2), tokens)
    shares = sum(_value(metrics, "kubeinfer_tenant_busy_seconds_total", tenant=t) for t in ("alpha", "beta",
                                                                                            "anonymous"))
    assert shares == pytest.approx(_value(metrics, "kubeinfer_engine_step_seconds_sum"), rel=1e-9)
    assert min(_value(metrics, "kubeinfer_tenant_busy_seconds_total", tenant=t) for t in ("alpha", "beta")) > 10


def test_the_accelerators_gauge_says_the_replicas_gpus():
    metrics = EngineMetrics("m", vllm_names=False)
    metrics.observe_engine(16, 100, 0, num_gpus=4)
    assert _value(metrics, "kubeinfer_replica_accelerators") == 4
