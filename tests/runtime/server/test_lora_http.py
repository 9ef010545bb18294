"""LoRA adapters through the HTTP API with the official openai client (docs/lora.md): loaded and unloaded at run
time under vLLM's routes and bodies, named by `model`, listed with their parent, refused with what is wrong, behind
the API keys, and shown in /metrics."""
import shutil

import httpx
import openai
import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from support import metric_value, scrape_metrics
from support.lora import make_adapter

PROMPT = "The key and value cache keeps"


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("http-adapters")
    return {name: make_adapter(llama_dir, root / name, rank=8, seed=seed) for seed, name in enumerate(("sql", "chat"))}


def _offline(llama_dir, adapter_path=None):
    llm = LLM(str(llama_dir), max_loras=1, max_lora_rank=16)
    if adapter_path is not None:
        llm.load_lora("x", str(adapter_path))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, lora_name="x" if adapter_path else None)
    return llm.generate(PROMPT, params)[0].text


def test_adapters_load_serve_list_and_unload_without_a_restart(llama_dir, adapters, start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("good-key\n")
    headers = {"Authorization": "Bearer good-key"}
    with start_server(llama_dir, str(keys), max_model_len=256, max_loras=2, max_lora_rank=16,
                      lora_modules={"sql": str(adapters["sql"]), "broken": str(tmp_path / "missing")}) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="good-key")
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"tiny", "sql"}   # the broken start-time adapter is left out, the server serves
        assert models["sql"].model_extra["parent"] == "tiny"
        assert models["sql"].model_extra["root"] == str(adapters["sql"])

        def complete(model):
            return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text

        assert complete("sql") == _offline(llama_dir, adapters["sql"])
        assert complete("tiny") == _offline(llama_dir)
        with pytest.raises(openai.NotFoundError) as missing:
            complete("chat")
        assert missing.value.body["code"] == "model_not_found"

        assert httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": str(adapters["chat"])}
                          ).status_code == 401
        answer = httpx.post(f"{url}/v1/load_lora_adapter", headers=headers,
                            json={"lora_name": "chat", "lora_path": str(adapters["chat"])})
        assert answer.status_code == 200, answer.text
        assert complete("chat") == _offline(llama_dir, adapters["chat"])
        chat = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4)
        assert chat.model == "chat"
        metrics = scrape_metrics(url)
        assert metric_value(metrics, "kubeinfer_lora_adapter_loaded", model_name="tiny", adapter="chat") == 1
        assert metric_value(metrics, "kubeinfer_lora_adapter_loaded", model_name="tiny", adapter="sql") == 1

        bad = httpx.post(f"{url}/v1/load_lora_adapter", headers=headers,
                         json={"lora_name": "bad", "lora_path": str(tmp_path / "nowhere")})
        assert bad.status_code == 400 and "is not a folder" in bad.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/load_lora_adapter", headers=headers,
                          json={"lora_name": "tiny", "lora_path": str(adapters["chat"])}).status_code == 400

        assert httpx.post(f"{url}/v1/unload_lora_adapter", headers=headers, json={"lora_name": "chat"}
                          ).status_code == 200
        with pytest.raises(openai.NotFoundError):
            complete("chat")
        assert httpx.post(f"{url}/v1/unload_lora_adapter", headers=headers, json={"lora_name": "chat"}
                          ).status_code == 404
        assert "chat" not in {m.id for m in client.models.list().data}
        metrics = scrape_metrics(url)
        assert ("kubeinfer_lora_adapter_loaded", (("adapter", "chat"), ("model_name", "tiny"))) not in metrics


def test_load_is_refused_when_lora_is_off(llama_dir, adapters, server):
    url, _ = server
    answer = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapters["sql"])})
    assert answer.status_code == 400 and "--max-loras" in answer.json()["error"]["message"]


def _vanish(folder):
    shutil.rmtree(folder)


def _corrupt(folder):
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])   # truncated mid-header, as a half-written copy leaves it


@pytest.mark.parametrize("fault, reason", [(_vanish, "is not a folder"), (_corrupt, "truncated or corrupt")],
                         ids=["vanished", "corrupt"])
def test_an_adapter_whose_files_fail_fails_its_own_requests_and_the_server_keeps_serving(
        llama_dir, start_server, tmp_path, fault, reason):
    """Chaos (issue #56): an adapter's folder deleted, or its weights truncated, after it was loaded, and its weights
    dropped from host memory (one host slot, another adapter used since). Its next request gets a 500 saying why,
    in the body and the stream; nothing is lost: the base model and the other adapter keep answering, on the same
    engine."""
    gone = make_adapter(llama_dir, tmp_path / "gone", rank=8, seed=5)
    kept = make_adapter(llama_dir, tmp_path / "kept", rank=8, seed=6)
    with start_server(llama_dir, max_model_len=256, max_loras=1, max_cpu_loras=1, max_lora_rank=16,
                      lora_modules={"gone": str(gone), "kept": str(kept)}) as (url, state):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def complete(model, **extra):
            return client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, **extra)

        complete("gone")
        complete("kept")   # one host slot: "gone" is dropped from memory, to be read from its folder next time
        fault(gone)
        with pytest.raises(openai.InternalServerError) as failed:
            complete("gone")
        assert "adapter 'gone'" in failed.value.body["message"] and reason in failed.value.body["message"]
        with pytest.raises(openai.APIError, match=f"adapter 'gone'.*{reason}"):   # a stream: an error event
            list(complete("gone", stream=True))
        assert state.engine.is_alive
        assert complete("kept").choices[0].text == complete("kept").choices[0].text
        assert complete("tiny").choices[0].finish_reason == "length"
