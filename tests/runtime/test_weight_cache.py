"""The node's weight cache (runtime/models/weight_cache.py): the first engine writes the model as it holds it; the next
one on the node loads it from there without reading the checkpoint (the loader is made to fail if it is read) and
answers as transformers does; a changed checkpoint gets a file of its own; a damaged file is ignored and written
again; a level-2 wake builds from the cache too."""
import logging
import os

import pytest

from kubeinfer.runtime.engine.sleep import weight_slots
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.models import loader
from kubeinfer.runtime.sampling_params import SamplingParams
from support.reference import assert_same_outputs, hf_greedy
from support.weights import same_bytes, use_linear_layout, weights_of

PROMPTS = ["Kubernetes runs containers", "Numbers: 0 1 2 3 4 5"]
TOKENS = 8


def greedy():
    return SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True, logprobs=5)


@pytest.fixture
def no_checkpoint_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint was read")
    return lambda: monkeypatch.setattr(loader, "load_weights", refuse)


@pytest.mark.parametrize("arch, layout", [("llama", "auto"), ("qwen2", "auto"), ("llama", "onednn")])
def test_a_second_engine_loads_from_the_cache_without_the_checkpoint(model_dirs, tmp_path, arch, layout,
                                                                   no_checkpoint_reads, monkeypatch):
    """An untied head and a tied one with its packed copy; the CPU's own linear layout (panels where their kernel
    runs) and oneDNN's (opaque weights: the file holds their plain bytes, packed again at load)."""
    use_linear_layout(monkeypatch, layout)
    model = model_dirs[arch]
    first = LLM(str(model), weight_cache_dir=str(tmp_path))
    [cached] = list(tmp_path.glob("*.weights"))
    if layout == "onednn":
        assert any(slot.opaque for slot in weight_slots([first.engine.model_runner.model]))
    prompt_ids = [first.tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(model, prompt_ids, TOKENS)
    assert_same_outputs(first.generate(prompt_ids, greedy()), reference)
    no_checkpoint_reads()
    second = LLM(str(model), weight_cache_dir=str(tmp_path))
    assert list(tmp_path.glob("*.weights")) == [cached] and not list(tmp_path.glob(".*partial"))
    assert second.engine.model_runner.weight_bytes == first.engine.model_runner.weight_bytes
    assert same_bytes(weights_of(second), weights_of(first))
    assert_same_outputs(second.generate(prompt_ids, greedy()), reference)
    second.sleep(2)   # a level-2 wake builds from the cache as well
    assert_same_outputs(second.generate(prompt_ids, greedy()), reference)


def test_a_changed_checkpoint_gets_its_own_file(model_dirs, tmp_path):
    model = model_dirs["llama"]
    LLM(str(model), weight_cache_dir=str(tmp_path))
    checkpoint = model / "model.safetensors"
    stat = checkpoint.stat()
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        LLM(str(model), weight_cache_dir=str(tmp_path))
        assert len(list(tmp_path.glob("*.weights"))) == 2
    finally:
        os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_file_is_ignored_and_written_again(model_dirs, tmp_path, damage, caplog):
    model = model_dirs["llama"]
    LLM(str(model), weight_cache_dir=str(tmp_path))
    [cached] = list(tmp_path.glob("*.weights"))
    intact = cached.read_bytes()
    cached.write_bytes(intact[:-4096] if damage == "truncated" else b"not ours" + intact[8:])
    with caplog.at_level(logging.WARNING, logger="kubeinfer.runtime.models.weight_cache"):
        llm = LLM(str(model), weight_cache_dir=str(tmp_path))
    assert "is not usable" in caplog.text
    assert cached.read_bytes() == intact
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    assert_same_outputs(llm.generate(prompt_ids, greedy()), hf_greedy(model, prompt_ids, TOKENS))


@pytest.mark.parametrize("read", ["map", "copy"])
def test_on_the_cpu_the_cached_weights_are_used_in_place_and_the_file_never_changes(model_dirs, tmp_path, read,
                                                                                  monkeypatch):
    """By default a CPU engine's weights from the cache are views of a private mapping of its file (no copy: the
    mapping is in /proc/self/maps); KUBEINFER_WEIGHT_CACHE_READ=copy reads them into new memory. Same bytes and
    transformers' answers both ways, and serving (and a level-1 sleep and wake) writes nothing to the file."""
    model = model_dirs["llama"]
    first = LLM(str(model), weight_cache_dir=str(tmp_path))
    [cached] = list(tmp_path.glob("*.weights"))
    written = cached.read_bytes()
    if read == "copy":
        monkeypatch.setenv("KUBEINFER_WEIGHT_CACHE_READ", "copy")
    second = LLM(str(model), weight_cache_dir=str(tmp_path))
    mapped = [line for line in open("/proc/self/maps").read().splitlines() if line.endswith(str(cached))]
    assert bool(mapped) == (read == "map"), mapped
    assert same_bytes(weights_of(second), weights_of(first))
    prompt_ids = [second.tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(model, prompt_ids, TOKENS)
    assert_same_outputs(second.generate(prompt_ids, greedy()), reference)
    second.sleep(1)
    second.wake_up()
    assert_same_outputs(second.generate(prompt_ids, greedy()), reference)
    assert cached.read_bytes() == written
