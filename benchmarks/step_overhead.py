"""CPU cost of one engine step outside the model: scheduling, the step's tokens by tenant (its time's shares,
the per-tenant busy seconds), block accounting, input preparation and post-processing, at N running sequences
(default 256), all decoding.

    python benchmarks/step_overhead.py [--num-seqs 256] [--steps 300] [--scheduling-policy fair]

Under `fair` the sequences belong to 8 tenants of 2 priority classes, and 64 more wait (the queue is read
every step).
"""
import argparse
import statistics
import time

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.model_runner import ModelRunner
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.scheduler_stats import TenantTokens
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompt-len", type=int, default=500)
    parser.add_argument("--scheduling-policy", default="fcfs", choices=("fcfs", "shortest-first", "fair"))
    args = parser.parse_args()
    config = EngineConfig(model="demo", max_num_seqs=args.num_seqs, max_num_batched_tokens=args.num_seqs * 600,
                          num_kvcache_blocks=args.num_seqs * 80, scheduling_policy=args.scheduling_policy)
    runner = ModelRunner(config)   # only its input preparation is timed
    manager = BlockManager(runner.num_blocks, config.block_size, config.max_num_seqs, runner.max_blocks_per_seq)
    scheduler = Scheduler(config, manager, (0,), runner.max_model_len)
    fair = args.scheduling_policy == "fair"
    for i in range(args.num_seqs):
        scheduler.add(Sequence(str(i), [(i * 7 + j) % 500 + 1 for j in range(args.prompt_len)],
                               SamplingParams(max_tokens=10**6, ignore_eos=True, tenant=f"t{i % 8}",
                                              priority=i % 2 if fair else 0)))
    batch = scheduler.schedule()          # the whole prefill in one step, not timed
    scheduler.postprocess(batch, [[1]] * len(batch))
    if fair:   # they wait behind the full running set: the fair queue is consulted every step
        for i in range(64):
            scheduler.add(Sequence(f"w{i}", [5] * args.prompt_len, SamplingParams(max_tokens=4, tenant=f"t{i % 8}",
                                                                                  priority=1)))
    tenant_tokens = TenantTokens()
    timings = {"schedule": [], "tenant shares": [], "prepare inputs": [], "postprocess": []}
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch = scheduler.schedule()
        t1 = time.perf_counter()
        tenant_tokens.count(batch)   # as EngineCore.step does
        t2 = time.perf_counter()
        runner.prepare(batch, manager)
        t3 = time.perf_counter()
        scheduler.postprocess(batch, [[step % 400 + 1]] * len(batch))
        t4 = time.perf_counter()
        assert len(batch) == args.num_seqs and batch.num_tokens == args.num_seqs
        for name, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            timings[name].append(value * 1e6)
    totals = [sum(parts) for parts in zip(*timings.values())]
    print(f"{args.num_seqs} running sequences, all decoding, context {args.prompt_len}..{args.prompt_len + args.steps}")
    print(f"{'part':<16}{'median us':>11}{'p99 us':>10}")
    for name, values in list(timings.items()) + [("total", totals)]:
        values = sorted(values)
        print(f"{name:<16}{statistics.median(values):>11.0f}{values[int(0.99 * len(values))]:>10.0f}")


if __name__ == "__main__":
    main()
