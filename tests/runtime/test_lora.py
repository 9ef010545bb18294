"""LoRA adapters in the engine (docs/lora.md): exact against PEFT's merged model, many adapters in one batch,
the prefix cache kept apart per adapter, slots shared when adapters outnumber them, and bad adapters refused
with what is wrong."""
import json

import pytest
import torch
from safetensors.torch import save_file

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.lora import make_adapter
from support.reference import assert_same_outputs, hf_greedy

PROMPTS = ["Kubernetes runs containers", "The key and value cache keeps the attention state of every token",
           "Numbers: 0 1 2 3 4 5"]
TOKENS = 8


def greedy(lora_name=None, max_tokens=TOKENS):
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=5, lora_name=lora_name)


@pytest.mark.parametrize("rank", [8, 64])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_output_equals_peft_merged_model(model_dirs, tmp_path, arch, rank):
    """q/k/v/o and gate/up/down adapted; fp32: the same tokens and top-5 logprobs within 1e-4 as transformers
    running the base model with PEFT's update merged into its weights."""
    base = model_dirs[arch]
    adapter = make_adapter(base, tmp_path / "adapter", rank, seed=rank, merged_dir=tmp_path / "merged")
    llm = LLM(str(base), max_loras=2, max_lora_rank=64)
    llm.load_lora("tuned", str(adapter))
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    ours = llm.generate(prompt_ids, greedy("tuned"))
    assert_same_outputs(ours, hf_greedy(tmp_path / "merged", prompt_ids, TOKENS))
    base_out = llm.generate(prompt_ids, greedy())
    assert [o.token_ids for o in base_out] != [o.token_ids for o in ours], "the adapter changed nothing"
    assert_same_outputs(base_out, hf_greedy(base, prompt_ids, TOKENS))


@pytest.fixture(scope="module")
def four_adapters(model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    modules = [None, ["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"], ["o_proj", "k_proj"]]
    return {f"a{i}": make_adapter(model_dirs["llama"], root / f"a{i}", rank=4 * (i + 1), seed=i,
                                  **({"modules": m} if m else {}))
            for i, m in enumerate(modules)}


def _serve(model_dir, adapters, **settings):
    llm = LLM(str(model_dir), max_lora_rank=16, **settings)
    for name, path in adapters.items():
        llm.load_lora(name, str(path))
    return llm


@pytest.mark.parametrize("max_loras", [4, 2])
def test_a_batch_mixing_four_adapters_and_the_base_equals_each_alone(model_dirs, four_adapters, max_loras):
    """Ten requests over four adapters and the base model in one generate call (one batch) give what each gives
    alone on a fresh engine. With 2 slots for 4 adapters, requests wait for a slot and adapters take turns."""
    names = [None, "a0", "a1", "a2", "a3"] * 2
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(names))]
    llm = _serve(model_dirs["llama"], four_adapters, max_loras=max_loras)
    together = llm.generate(prompts, [greedy(name) for name in names])
    assert llm.engine.scheduler.loras.in_use() == {}
    for prompt, name, output in zip(prompts, names, together):
        alone = _serve(model_dirs["llama"], four_adapters, max_loras=1).generate(prompt, greedy(name))
        assert_same_outputs([output], alone)
    assert len({tuple(o.token_ids) for o in together[:5]}) == 5   # every adapter (and the base) differs


def test_the_prefix_cache_is_kept_apart_per_adapter(model_dirs, four_adapters):
    """The same long prompt under an adapter, then under the base model and another adapter: no KV is reused
    across them (each result equals a fresh engine's), while the same adapter again hits the cache."""
    prompt = PROMPTS[1] * 3
    llm = _serve(model_dirs["llama"], four_adapters, max_loras=2)
    first = llm.generate(prompt, greedy("a0"))[0]
    for name in (None, "a1"):
        output = llm.generate(prompt, greedy(name))[0]
        assert output.num_cached_tokens == 0
        assert_same_outputs([output], _serve(model_dirs["llama"], four_adapters, max_loras=1).generate(
            prompt, greedy(name)))
    again = llm.generate(prompt, greedy("a0"))[0]
    assert again.num_cached_tokens > 0 and again.token_ids == first.token_ids


def test_unknown_and_unloaded_adapters_are_refused(model_dirs, four_adapters):
    llm = _serve(model_dirs["llama"], {"a0": four_adapters["a0"]}, max_loras=1)
    with pytest.raises(InvalidRequestError, match="no LoRA adapter 'nope'"):
        llm.generate("hi", greedy("nope"))
    assert llm.unload_lora("a0") and not llm.unload_lora("a0")
    with pytest.raises(InvalidRequestError, match="no LoRA adapter 'a0'"):
        llm.generate("hi", greedy("a0"))


def _edit_config(folder, **changes):
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | changes))


def test_bad_adapters_are_refused_with_what_is_wrong(model_dirs, four_adapters, tmp_path):
    llm = _serve(model_dirs["llama"], {}, max_loras=1)
    cases = []
    cases.append((tmp_path / "absent", "is not a folder"))
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", "adapter_config.json not found"))
    high = make_adapter(model_dirs["llama"], tmp_path / "high", rank=32, seed=1)
    cases.append((high, "rank 32, above this server's --max-lora-rank 16"))
    other = make_adapter(model_dirs["qwen3"], tmp_path / "other", rank=8, seed=1)   # head_dim 32, not 16
    cases.append((other, "do not fit the base model"))
    dora = make_adapter(model_dirs["llama"], tmp_path / "dora", rank=8, seed=1)
    _edit_config(dora, use_dora=True)
    cases.append((dora, "DoRA"))
    no_weights = make_adapter(model_dirs["llama"], tmp_path / "no-weights", rank=8, seed=1)
    (no_weights / "adapter_model.safetensors").unlink()
    cases.append((no_weights, "adapter_model.safetensors not found"))
    truncated = make_adapter(model_dirs["llama"], tmp_path / "truncated", rank=8, seed=1)
    (truncated / "adapter_model.safetensors").write_bytes(b"\x10\x00")
    cases.append((truncated, "cannot be read .*truncated or corrupt"))
    not_an_object = make_adapter(model_dirs["llama"], tmp_path / "list-config", rank=8, seed=1)
    (not_an_object / "adapter_config.json").write_text("[]")
    cases.append((not_an_object, "is not a JSON object"))
    for path, message in cases:
        with pytest.raises(InvalidRequestError, match=message):
            llm.load_lora("bad", str(path))
    llm.load_lora("good", str(four_adapters["a0"]))
    llm.load_lora("good", str(four_adapters["a0"]))   # again, same folder: a no-op
    with pytest.raises(InvalidRequestError, match="already loaded from"):
        llm.load_lora("good", str(four_adapters["a1"]))
    assert llm.generate("hi", greedy("good"))[0].token_ids
    off = LLM(str(model_dirs["llama"]))
    with pytest.raises(InvalidRequestError, match="--max-loras"):
        off.load_lora("good", str(four_adapters["a0"]))


def test_an_adapter_of_a_mixture_of_experts_layer_is_refused(moe_dirs, tmp_path):
    adapter = make_adapter(moe_dirs["qwen3moe"], tmp_path / "attn", rank=8, seed=0, modules=["q_proj", "o_proj"])
    llm = LLM(str(moe_dirs["qwen3moe"]), max_loras=1)
    llm.load_lora("attn", str(adapter))   # attention only: served
    assert llm.generate("hi", greedy("attn"))[0].token_ids
    mlp = tmp_path / "mlp"   # written by hand: layer 0's MLP is sparse (PEFT cannot target its fused experts)
    mlp.mkdir()
    (mlp / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 8}))
    prefix = "base_model.model.model.layers.0.mlp.gate_proj"
    save_file({f"{prefix}.lora_A.weight": torch.zeros(8, 64), f"{prefix}.lora_B.weight": torch.zeros(128, 8)},
              str(mlp / "adapter_model.safetensors"))
    with pytest.raises(InvalidRequestError, match="mixture of experts"):
        llm.load_lora("mlp", str(mlp))


def test_a_request_waiting_for_an_adapter_slot_lets_base_model_requests_pass(model_dirs, four_adapters):
    """One slot, held by a running request of a0: a request of a1 waits for it, and so does a later one of a2 (in
    their order), while a base-model request behind them starts at once. All end with what each gives alone."""
    llm = _serve(model_dirs["llama"], four_adapters, max_loras=1)
    engine = llm.engine
    names = ["a0", "a1", "a2", None]
    for i, name in enumerate(names):
        engine.add_request(str(i), PROMPTS[i % len(PROMPTS)], greedy(name, max_tokens=12))
    engine.step()
    running = {seq.request_id for seq in engine.scheduler.running}
    assert running == {"0", "3"}
    assert [seq.request_id for seq in engine.scheduler.waiting] == ["1", "2"]
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    for i, name in enumerate(names):
        alone = _serve(model_dirs["llama"], four_adapters, max_loras=1).generate(PROMPTS[i % len(PROMPTS)],
                                                                               greedy(name, max_tokens=12))
        assert_same_outputs([finals[str(i)]], alone)


def test_requests_already_accepted_finish_on_an_adapter_unloaded_and_deleted_meanwhile(model_dirs, tmp_path):
    """Unloading stops new requests only: those already in the engine finish on the adapter even when its folder is
    deleted right after (the engine keeps its copy while they need it), with what they give when nothing changes."""
    import shutil
    adapter = make_adapter(model_dirs["llama"], tmp_path / "gone", rank=8, seed=11)
    want = _serve(model_dirs["llama"], {"gone": adapter}, max_loras=1).generate(PROMPTS[0], greedy("gone"))
    llm = _serve(model_dirs["llama"], {"gone": adapter, "other": make_adapter(
        model_dirs["llama"], tmp_path / "other", rank=8, seed=12)}, max_loras=1)
    engine = llm.engine
    engine.add_request("other", PROMPTS[1], greedy("other", max_tokens=30))   # holds the only slot
    engine.step()
    engine.add_request("late", PROMPTS[0], greedy("gone"))                     # waits for the slot
    assert llm.unload_lora("gone")
    shutil.rmtree(adapter)
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    assert_same_outputs([finals["late"]], want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_adapter_decode_steps_replay_cuda_graphs_and_give_the_eager_outputs(model_dirs, four_adapters):
    """On CUDA (Triton's batched LoRA kernel, fp32): ten requests over four adapters and the base model, two slots,
    give the same tokens (logprobs within 1e-4) whether their decode steps replay CUDA graphs or run eagerly.
    Adapters take turns in the two slots, so graphs replay over slots refilled between replays."""
    names = [None, "a0", "a1", "a2", "a3"] * 2
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(names))]
    settings = dict(max_loras=2, device="cuda", dtype="float32", num_kvcache_blocks=256)
    eager_llm = _serve(model_dirs["llama"], four_adapters, enforce_eager=True, **settings)
    assert eager_llm.engine.model_runner.cuda_graphs is None
    eager = eager_llm.generate(prompts, [greedy(name, 12) for name in names])
    del eager_llm
    llm = _serve(model_dirs["llama"], four_adapters, cuda_graph_max_batch_size=8, **settings)
    graphed = llm.generate(prompts, [greedy(name, 12) for name in names])
    graphs = llm.engine.model_runner.cuda_graphs
    assert sorted(graphs.lora_graphs) == graphs.batch_sizes == [1, 2, 4, 8]
    assert graphs.num_lora_replays > 0, "no decode step with adapters replayed a graph"
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert abs(x.logprob - y.logprob) <= 1e-4
