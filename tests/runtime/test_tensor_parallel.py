"""Tensor parallelism on CPU with gloo: TP=2/4 give TP=1's greedy tokens and logprobs, and transformers'.

The helpers at the top (`PROMPTS`, `PARAMS`, `tp_outputs`) and `support.reference.assert_same_outputs` are meant
to be reused by tests that drive a TP engine through another front end (the HTTP server): produce the TP=1
outputs with `tp_outputs(model_dir, 1)` and compare whatever the front end returns with `assert_same_outputs`.
"""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers as tf

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support import wait_for
from support.reference import assert_same_outputs, hf_greedy

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]
PROMPTS = ["Kubernetes runs containers", "a", "The key and value cache keeps the attention state of every token",
           "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000"]
MAX_TOKENS = 10
TOP_N = 5
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N)
ODD_VOCAB = 387       # the tokenizer has 384 tokens; 387 splits over neither 2 nor 4 ranks


def tp_outputs(model_dir, tp: int, prompts=PROMPTS, params=PARAMS, **settings):
    """Greedy outputs of `prompts` (token ids or text) from an engine with `tp` ranks, which is then stopped."""
    with LLM(str(model_dir), tensor_parallel_size=tp, max_num_batched_tokens=64, num_kvcache_blocks=64,
             **settings) as llm:
        prompt_ids = [llm.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
        outputs = llm.generate(prompt_ids, params)   # one batch, mixed lengths, chunked prefill
        if tp > 1:
            workers = llm.engine.model_runner.workers.processes
    if tp > 1:   # a clean stop: every worker left its loop and exited 0
        assert [p.exitcode for p in workers] == [0] * (tp - 1)
        assert not torch.distributed.is_initialized()
    return outputs


def with_vocab(model_dir: Path, dest: Path, vocab_size: int) -> Path:
    """A copy of the model with its vocabulary grown to `vocab_size` (new rows random, as padded vocabularies
    of real checkpoints are)."""
    torch.manual_seed(1)
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, dest / name)
    assert json.loads((dest / "config.json").read_text())["vocab_size"] == vocab_size
    return dest


@pytest.fixture(scope="module")
def odd_vocab_dir(model_dirs, tmp_path_factory) -> Path:
    """llama3 (one KV head for four query heads, tied embeddings) with a vocabulary of ODD_VOCAB tokens."""
    return with_vocab(model_dirs["llama3"], tmp_path_factory.mktemp("odd-vocab"), ODD_VOCAB)


def prompt_ids_of(model_dir) -> list[list[int]]:
    from kubeinfer.runtime.tokenizer import Tokenizer
    tokenizer = Tokenizer(str(model_dir))
    return [tokenizer.encode(p) for p in PROMPTS]


def check_tp(model_dir, tp: int) -> None:
    ids = prompt_ids_of(model_dir)
    single = tp_outputs(model_dir, 1, ids)
    assert_same_outputs(single, hf_greedy(model_dir, ids, MAX_TOKENS))
    assert_same_outputs(tp_outputs(model_dir, tp, ids), single)


# -- default run: TP=2 on an odd vocabulary with one KV head (replicated), and on Qwen2 (biases, split KV) --

def test_tp2_odd_vocab_one_kv_head_matches_tp1_and_transformers(odd_vocab_dir):
    check_tp(odd_vocab_dir, 2)


def test_tp2_qwen2_matches_tp1_and_transformers(model_dirs):
    check_tp(model_dirs["qwen2"], 2)


def test_tp2_sampling_with_a_seed_matches_tp1(model_dirs):
    """Only rank 0 samples, from the full logits: a seeded draw is the same as with one rank."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    single = tp_outputs(model_dirs["llama"], 1, params=params)
    assert [o.token_ids for o in tp_outputs(model_dirs["llama"], 2, params=params)] == \
        [o.token_ids for o in single]


def test_tp2_speculative_greedy_matches_tp1_plain_greedy(model_dirs):
    """Drafts are verified by the sharded forward and accepted on rank 0: the tokens of plain TP=1 decoding."""
    prompts = [[7, 8, 9, 10] * 6, list(range(0, 380, 3)), [5, 6] * 10 + [1]]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=TOP_N)
    plain = tp_outputs(model_dirs["llama"], 1, prompts, params)
    with LLM(str(model_dirs["llama"]), tensor_parallel_size=2, max_num_batched_tokens=64, num_kvcache_blocks=64,
             speculative_method="ngram", speculative_ngram_min=1) as llm:
        ours = llm.generate(prompts, params)
        stats = llm.engine.scheduler.stats
    assert_same_outputs(ours, plain)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens   # drafts accepted and rejected


def test_tp2_lora_adapters_match_tp1(model_dirs, tmp_path):
    """Two adapters (every projection, ranks 8 and 16) and the base model in one batch, each rank holding its shard
    of every adapter (column-parallel B rows, row-parallel A columns): TP=1's tokens and logprobs."""
    from support.lora import make_adapter
    adapters = {f"a{rank}": str(make_adapter(model_dirs["qwen3"], tmp_path / f"a{rank}", rank, seed=rank))
                for rank in (8, 16)}
    names = [None, "a8", "a16", "a8"]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N, lora_name=n)
              for n in names]
    settings = dict(max_loras=2, lora_modules=adapters)
    assert_same_outputs(tp_outputs(model_dirs["qwen3"], 2, params=params, **settings),
                        tp_outputs(model_dirs["qwen3"], 1, params=params, **settings))


def test_tp2_workers_never_read_adapter_folders(model_dirs, tmp_path):
    """Chaos (issue #56): an adapter's folder removed right after rank 0 read it for a slot, before the step that
    loads the slot (the race a vanishing mount makes). Rank 0 sends the weights, so the worker's step still runs
    and the tokens are TP=1's; an adapter whose folder is gone before rank 0 reads it ends only its own request."""
    from support.lora import make_adapter
    folders = {name: make_adapter(model_dirs["qwen3"], tmp_path / name, 8, seed=seed)
               for name, seed in (("raced", 3), ("gone", 4))}
    settings = dict(max_loras=1, max_cpu_loras=1, lora_modules={n: str(f) for n, f in folders.items()})
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=TOP_N, lora_name=n)
              for n in (None, "raced", None, "raced")]
    reference = tp_outputs(model_dirs["qwen3"], 1, params=params, **settings)
    with LLM(str(model_dirs["qwen3"]), tensor_parallel_size=2, max_num_batched_tokens=64, num_kvcache_blocks=64,
             **settings) as llm:
        slots = llm.engine.scheduler.loras
        read_by_rank0 = slots.prepare

        def read_then_vanish(name, path, digest):
            adapter = read_by_rank0(name, path, digest)
            shutil.rmtree(path)
            return adapter

        slots.prepare = read_then_vanish
        prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
        assert_same_outputs(llm.generate(prompt_ids, params), reference)
        assert not folders["raced"].exists()   # removed before the worker's step, which never needed it
        shutil.rmtree(folders["gone"])
        mixed = llm.generate(prompt_ids[:2], [params[0], SamplingParams(max_tokens=MAX_TOKENS, lora_name="gone")])
        assert mixed[0].token_ids == reference[0].token_ids
        assert mixed[1].finish_reason == "error" and "is not a folder" in mixed[1].error
        workers = llm.engine.model_runner.workers.processes
        assert [p.exitcode for p in workers] == [None]
    assert [p.exitcode for p in workers] == [0]


def test_one_tensor_parallel_engine_per_process(llama_dir):
    with LLM(str(llama_dir), tensor_parallel_size=2, num_kvcache_blocks=16):
        with pytest.raises(RuntimeError, match="one parallel engine per process"):
            LLM(str(llama_dir), num_kvcache_blocks=16)
        with pytest.raises(RuntimeError, match="one parallel engine per process"):
            LLM(str(llama_dir), tensor_parallel_size=2, num_kvcache_blocks=16)
    assert tp_outputs(llama_dir, 1, PROMPTS[:1])[0].token_ids   # usable again once it is stopped


# -- slow: every architecture at TP=2 and TP=4, and the odd vocabulary at TP=4 --

@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_arch_matches_tp1_and_transformers(model_dirs, arch, tp):
    check_tp(model_dirs[arch], tp)


@pytest.mark.slow
def test_tp4_odd_vocab_one_kv_head(odd_vocab_dir):
    check_tp(odd_vocab_dir, 4)


# -- validation --

def _model_with(model_dir: Path, dest: Path, **changes) -> Path:
    """A folder holding only a config.json changed by `changes` (EngineConfig reads nothing else)."""
    dest.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, **changes}))
    return dest


def test_tp_size_must_divide_the_attention_heads(llama_dir):
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide the model's 4 attention heads"):
        EngineConfig(model=str(llama_dir), tensor_parallel_size=3)


def test_tp_size_must_divide_or_be_a_multiple_of_the_kv_heads(llama_dir, tmp_path):
    model = _model_with(llama_dir, tmp_path / "m", num_attention_heads=12, num_key_value_heads=3, head_dim=16,
                         intermediate_size=192)
    with pytest.raises(ConfigError, match="neither divides the model's 3 KV heads nor is a multiple of them"):
        EngineConfig(model=str(model), tensor_parallel_size=2)
    EngineConfig(model=str(model), tensor_parallel_size=3)     # 3 ranks, one KV head each
    EngineConfig(model=str(model), tensor_parallel_size=6)     # 6 ranks, each KV head on two


def test_tp_size_must_not_exceed_the_gpus(llama_dir, monkeypatch):
    """Counted on a (pretended) one-GPU machine, so the check runs here without GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="needs 4 GPUs; this machine has 1"):
        EngineConfig(model=str(llama_dir), tensor_parallel_size=4, device="cuda").resolve_device()


def test_tp2_sleeps_and_wakes_with_every_rank(model_dirs, tmp_path, monkeypatch):
    """Rank 0 tells the workers to sleep and wake with it, each freeing and restoring its own shard: asleep at level
    1, the worker holds its weights' sleep file (unlinked, seen in /proc), and keeps it after the wake for its next
    sleep; level 2 drops it; after a level-1 and a level-2 sleep the sharded forward's greedy outputs are
    transformers' again."""
    monkeypatch.setenv("KUBEINFER_SLEEP_DIR", str(tmp_path))   # the workers inherit it

    def sleep_files(pid: int) -> list[str]:
        targets = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir() if fd.is_symlink()]
        return [t for t in targets if t.startswith(f"{tmp_path}/")]   # O_TMPFILE: "DIR/#inode (deleted)"

    model = model_dirs["qwen2"]
    ids = prompt_ids_of(model)
    reference = hf_greedy(model, ids, MAX_TOKENS)
    with LLM(str(model), tensor_parallel_size=2, max_num_batched_tokens=64, num_kvcache_blocks=64) as llm:
        [worker] = llm.engine.model_runner.workers.processes
        assert_same_outputs(llm.generate(ids, PARAMS), reference)
        for level in (1, 2):
            assert llm.sleep(level)["level"] == level
            if level == 1:
                wait_for(lambda: sleep_files(worker.pid), 60, "the worker's level-1 sleep file")
            assert_same_outputs(llm.generate(ids, PARAMS), reference)
            # after a level-1 wake the file is kept for the next sleep; a level-2 sleep dropped it
            assert bool(sleep_files(worker.pid)) == (level == 1), sleep_files(worker.pid)
        llm.sleep(1)
        wait_for(lambda: sleep_files(worker.pid), 60, "the worker's level-1 sleep file")
        llm.sleep(2)   # deepened on every rank: the worker drops its copy
        wait_for(lambda: not sleep_files(worker.pid), 60, "the worker to drop its copy at level 2")
        assert_same_outputs(llm.generate(ids, PARAMS), reference)
    assert worker.exitcode == 0
