"""Adapters from a watched file (`--lora-modules-file`, docs/lora.md): the server loads what the file adds, loads
again what moved, unloads what it dropped (never what was loaded over HTTP), and `GET /lora/adapters` (no key
needed) says what is served and what was refused with the engine's words."""
import httpx
import pytest

from kubeinfer.operator.reconcile.lora import sync
from kubeinfer.runtime.server import lora_file
from kubeinfer.runtime.server.lora_file import read_modules
from support import wait_for
from support.lora import make_adapter

KEY = {"Authorization": "Bearer the-key"}


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("file-adapters")
    return {"a": make_adapter(llama_dir, root / "a", rank=4, seed=1),
            "b": make_adapter(llama_dir, root / "b", rank=4, seed=2),
            "big": make_adapter(llama_dir, root / "big", rank=32, seed=3)}


def write_and_wait(state, path, text: str) -> list[dict]:
    """Writes the file, waits for the watcher's next pass, and returns /lora/adapters' report of it."""
    before = state.lora_file.passes
    path.write_text(text)
    wait_for(lambda: state.lora_file.passes > before, 120, "the watcher to apply the file")
    return lora_file.report(state.loras, state.lora_file.failed)


def served(url: str) -> dict[str, dict]:
    reply = httpx.get(url + "/lora/adapters", timeout=30)   # no key: open, as /metrics
    assert reply.status_code == 200, reply.text
    return {entry["name"]: entry for entry in reply.json()["adapters"]}


def test_the_server_follows_the_file(llama_dir, start_server, adapters, tmp_path):
    modules, keys = tmp_path / "modules", tmp_path / "keys"
    keys.write_text("the-key\n")
    modules.write_text("")
    with start_server(llama_dir, str(keys), max_model_len=256, max_loras=2, max_lora_rank=16,
                      lora_modules_file=str(modules)) as (url, state):
        write_and_wait(state, modules, f"--lora-modules a={adapters['a']} bad={adapters['big']}\n")
        report = served(url)
        assert report["a"] == {"name": "a", "path": str(adapters["a"]), "loaded": True, "message": ""}
        assert not report["bad"]["loaded"] and "rank 32" in report["bad"]["message"]
        # the operator reads this very report (no key) into InferenceService status
        with httpx.Client(timeout=30) as client:
            outcomes = sync.outcomes_of("p0", sync.read_replica(client, url),
                                        {"a": str(adapters["a"]), "bad": str(adapters["big"]), "later": "/x"})
        assert [(o.adapter, o.ready) for o in outcomes] == [("a", True), ("bad", False), ("later", False)]
        assert "rank 32" in outcomes[1].message and outcomes[2].message.startswith("not loaded yet")
        models = httpx.get(url + "/v1/models", headers=KEY, timeout=30).json()["data"]
        assert [m["id"] for m in models if m.get("parent")] == ["a"]
        completion = httpx.post(url + "/v1/completions", headers=KEY, timeout=60,
                                json={"model": "a", "prompt": "hello", "max_tokens": 2})
        assert completion.status_code == 200, completion.text
        # an adapter loaded over HTTP is not the file's: the watcher leaves it
        loaded = httpx.post(url + "/v1/load_lora_adapter", headers=KEY, timeout=60,
                            json={"lora_name": "by-hand", "lora_path": str(adapters["b"])})
        assert loaded.status_code == 200, loaded.text
        # a moved, b added, bad dropped
        write_and_wait(state, modules, f"--lora-modules a={adapters['b']} b={adapters['b']}\n")
        report = served(url)
        assert report["a"]["path"] == str(adapters["b"]) and report["a"]["loaded"]
        assert report["b"]["loaded"] and "bad" not in report and report["by-hand"]["loaded"]
        write_and_wait(state, modules, "\n")
        assert set(served(url)) == {"by-hand"}


def test_without_the_file_the_report_lists_what_is_loaded(server):
    url, state = server
    assert served(url) == {}


@pytest.mark.parametrize("text, expected", [
    ("", {}), ("\n", {}), ("--lora-modules a=/x b=/y\n", {"a": "/x", "b": "/y"}), ("a=/x", {"a": "/x"}),
])
def test_the_file_holds_the_flag_the_fetcher_writes(text, expected):
    assert read_modules(text) == expected
