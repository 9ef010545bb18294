"""Bad input raises a clear, typed error."""
import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from kubeinfer.runtime.errors import (ConfigError, InvalidRequestError, ModelLoadError, UnsupportedModelError)
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams


@pytest.mark.parametrize("settings, param", [
    ({"max_tokens": 0}, "max_tokens"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"temperature": -0.1}, "temperature"), ({"top_k": 0}, "top_k"), ({"min_p": 2.0}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"logprobs": 50}, "logprobs"), ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"), ({"stop": [""]}, "stop"),
    ({"seed": 2**64}, "seed"), ({"seed": -2**63 - 1}, "seed"),   # a seed torch cannot take crashed the engine
])
def test_bad_sampling_params(settings, param):
    with pytest.raises(InvalidRequestError) as error:
        SamplingParams(**settings)
    assert error.value.param == param and param.split("_")[0] in str(error.value)


def test_prompt_longer_than_max_model_len(llama_dir):
    llm = LLM(str(llama_dir), max_model_len=32)
    with pytest.raises(InvalidRequestError, match="32 tokens"):
        llm.generate([[5] * 40])
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate([[]])
    with pytest.raises(InvalidRequestError, match=r"token ids must be in \[0, "):
        llm.generate([[10**6]])
    assert llm.engine.scheduler.num_unfinished == 0


def test_output_is_cut_at_max_model_len(llama_dir):
    llm = LLM(str(llama_dir), max_model_len=32)
    [output] = llm.generate([[5] * 30], SamplingParams(max_tokens=10, ignore_eos=True))
    assert len(output.token_ids) == 2 and output.finish_reason == "length"


def test_unknown_architecture(llama_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        LLM(str(tmp_path / "m"))


def test_missing_weight_files_and_tensors(llama_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path / "m")
    [weights] = (tmp_path / "m").glob("*.safetensors")
    tensors = load_file(weights)
    weights.unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        LLM(str(tmp_path / "m"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(ModelLoadError, match=r"model.layers.1.mlp.gate_up_proj.weight \[1\]"):
        LLM(str(tmp_path / "m"))


def test_bad_engine_settings(llama_dir, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        LLM(str(tmp_path / "nowhere"))
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(ConfigError, match="is not a folder"):
        LLM(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelLoadError, match="config.json"):
        LLM(str(tmp_path))
    with pytest.raises(ConfigError, match="block_size"):
        LLM(str(llama_dir), block_size=12)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        LLM(str(llama_dir), max_model_len=10**6)
