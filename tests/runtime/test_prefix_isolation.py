"""Who may reuse whose prefix cache blocks (docs/runtime.md, "Prefix cache isolation"): requests share blocks only
when their adapter's weights, their sharing scope (tenant or trust group) and their cache_salt are all equal; no
name, salt or tenant a client picks makes two different ones equal; an adapter's KV is never reused under another
adapter or the base model, whatever the order requests come in."""
import itertools
import shutil
import uuid

import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support.lora import make_adapter
from support.reference import assert_same_outputs

PROMPT = "The key and value cache keeps the attention state of every token it has seen so far. " * 2
TOKENS = 6


def greedy(**fields) -> SamplingParams:
    return SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True, logprobs=3, **fields)


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir), max_model_len=256)


def cached(llm, prompt, **fields) -> int:
    return llm.generate(prompt, greedy(**fields))[0].num_cached_tokens


def test_scopes_share_blocks_only_with_the_same_scope(llm):
    """Tenant a's prompt is not reused by tenant b (nor by unscoped traffic), but is by a again; tenants of one
    trust group share; unscoped (`--prefix-cache-sharing shared`) requests share with each other."""
    prompt = "scopes: " + PROMPT
    assert len(llm.tokenizer.encode(prompt)) >= 3 * llm.engine.config.block_size
    first = llm.generate(prompt, greedy(cache_scope=("tenant", "a")))[0]
    other = llm.generate(prompt, greedy(cache_scope=("tenant", "b")))[0]
    assert first.num_cached_tokens == 0 and other.num_cached_tokens == 0
    assert other.token_ids == first.token_ids   # the same answer, computed again
    assert cached(llm, prompt) == 0   # unscoped: none of the tenants' blocks
    assert cached(llm, prompt, cache_scope=("tenant", "a")) > 0
    assert cached(llm, prompt, cache_scope=("group", "g")) == 0
    assert cached(llm, prompt, cache_scope=("group", "g")) > 0
    assert cached(llm, prompt) > 0   # the unscoped request before left its blocks to unscoped ones


def test_a_salt_keeps_a_prefix_to_requests_with_the_same_salt(llm):
    prompt = "salts: " + PROMPT
    assert cached(llm, prompt, cache_salt="s1") == 0
    assert cached(llm, prompt) == 0
    assert cached(llm, prompt, cache_salt="s2") == 0
    assert cached(llm, prompt, cache_salt="s1") > 0
    assert cached(llm, prompt, cache_salt="s1", cache_scope=("tenant", "a")) == 0   # salt and scope both count


@pytest.mark.parametrize("first, second", [
    ({"cache_scope": ("tenant", "a"), "cache_salt": "b|c"}, {"cache_scope": ("tenant", "a|b"), "cache_salt": "c"}),
    ({"cache_scope": ("tenant", "x")}, {"cache_scope": ("group", "x")}),
    ({"cache_scope": ("tenant", "x")}, {"cache_salt": "tenant:x"}),
    ({"cache_scope": ("tenant", "x")}, {"cache_salt": "x"}),
    ({"cache_salt": "('tenant', 'x')"}, {"cache_scope": ("tenant", "x")}),
])
def test_crafted_name_and_salt_collisions_do_not_share(llm, first, second):
    """Pairs a root joined into one string (or hashed from one) could confuse: compared whole, they differ."""
    prompt = f"{uuid.uuid4().hex} collision: " + PROMPT
    assert cached(llm, prompt, **first) == 0
    assert cached(llm, prompt, **second) == 0
    assert cached(llm, prompt, **first) > 0


def test_an_adapter_named_or_salted_like_another_never_shares_its_kv(llama_dir, tmp_path):
    """vLLM's bug (#44701): an adapter's name equal to a request's cache_salt let them share KV. Here a request
    salted with the adapter's name, or with its content digest, reuses none of the adapter's blocks."""
    adapter = make_adapter(llama_dir, tmp_path / "tuned", rank=4, seed=3)
    llm = LLM(str(llama_dir), max_model_len=256, max_loras=1)
    llm.load_lora("tuned", str(adapter))
    prompt = "adapter and salt: " + PROMPT
    assert cached(llm, prompt, lora_name="tuned") == 0
    for salt in ["tuned", llm.engine.core.lora_ids["tuned"]]:
        assert cached(llm, prompt, cache_salt=salt) == 0
    assert cached(llm, prompt, lora_name="tuned") > 0


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    """A and B (different weights), and A's files again in another folder (the same adapter under another name)."""
    root = tmp_path_factory.mktemp("isolation-adapters")
    a = make_adapter(llama_dir, root / "a", rank=4, seed=11)
    b = make_adapter(llama_dir, root / "b", rank=4, seed=12)
    shutil.copytree(a, root / "a-copy")
    return {"A": a, "B": b, "A2": root / "a-copy"}


def test_adapter_kv_is_never_reused_across_adapters_or_the_base_in_any_mix(llama_dir, adapters):
    """Every order of the base model, A, B and A's copy on one prompt, on an engine with the prefix cache: each
    output equals the cache-off engine's, and a request reuses blocks exactly when the same weights came before
    (A's copy under another name is the same adapter: it shares A's blocks)."""
    settings = dict(max_model_len=256, max_loras=2, max_lora_rank=16)
    cold = LLM(str(llama_dir), enable_prefix_caching=False, **settings)
    warm = LLM(str(llama_dir), **settings)
    for llm in (cold, warm):
        for name, path in adapters.items():
            llm.load_lora(name, str(path))
    weights = {None: None, "A": "a", "B": "b", "A2": "a"}
    names = list(weights)
    references = {name: cold.generate(PROMPT, greedy(lora_name=name)) for name in names}
    assert len({tuple(out[0].token_ids) for out in references.values()}) == 3   # base, A, B all differ
    for number, order in enumerate(itertools.permutations(names)):
        prompt = f"order {number}: {PROMPT}"
        seen = set()
        for name in order:
            output = warm.generate(prompt, greedy(lora_name=name))
            expected = cold.generate(prompt, greedy(lora_name=name))
            assert_same_outputs(output, expected)
            assert (output[0].num_cached_tokens > 0) == (weights[name] in seen), (order, name)
            seen.add(weights[name])


def test_a_name_loaded_again_from_other_weights_does_not_reuse_the_old_weights_kv(llama_dir, adapters):
    """Unload A and load the name A from B's folder: A's requests now equal B's and reuse B's blocks, never
    the old A's."""
    llm = LLM(str(llama_dir), max_model_len=256, max_loras=2, max_lora_rank=16)
    llm.load_lora("A", str(adapters["A"]))
    llm.load_lora("B", str(adapters["B"]))
    prompt = "reloaded: " + PROMPT
    old = llm.generate(prompt, greedy(lora_name="A"))[0]
    assert llm.unload_lora("A")
    llm.load_lora("A", str(adapters["B"]))
    now = llm.generate(prompt, greedy(lora_name="A"))[0]
    assert now.num_cached_tokens == 0 and logprobs(now) != logprobs(old)
    under_b = llm.generate(prompt, greedy(lora_name="B"))[0]
    assert under_b.num_cached_tokens > 0
    assert_same_outputs([under_b], [now])


def logprobs(output) -> list[float]:
    return [round(step.logprob, 4) for step in output.logprobs]


def test_adapter_files_changed_in_place_are_refused_not_served_under_the_old_digest(llama_dir, tmp_path):
    """The prefix cache keys an adapter's KV by the digest of the files it loaded. New weights written into the
    same folder (read again once its weights left host memory) would be served under the old digest: that request
    ends with an error saying so, and the others go on."""
    a = make_adapter(llama_dir, tmp_path / "a", rank=4, seed=21)
    b = make_adapter(llama_dir, tmp_path / "b", rank=4, seed=22)
    llm = LLM(str(llama_dir), max_model_len=256, max_loras=1, max_cpu_loras=1)
    llm.load_lora("a", str(a))
    llm.load_lora("b", str(b))
    before_a = llm.generate(PROMPT, greedy(lora_name="a"))[0]
    llm.generate(PROMPT, greedy(lora_name="b"))   # one host slot: a's weights leave memory
    shutil.copy(b / "adapter_model.safetensors", a / "adapter_model.safetensors")
    refused = llm.generate(PROMPT, greedy(lora_name="a"))[0]
    assert refused.finish_reason == "error" and "changed since it was loaded" in refused.error
    assert refused.token_ids == [] and before_a.token_ids
    assert llm.generate(PROMPT, greedy(lora_name="b"))[0].finish_reason == "length"
