"""A model pool through the router (docs/router.md, "Model pool"), on real processes: one "pod" (this host) runs
`kubeinfer pool` with two different random models, at most one awake. Requests that
alternate between the models, and concurrent streams that pick either, are all answered whole with each model's own
answer; while they run, an observer reading both engines' sleep level every few milliseconds never sees both
awake, and the two processes' memory together stays below halfway from one model awake (the other asleep) to
both awake. SIGTERM then stops the pool: every engine, and the launcher with exit 0."""
import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubeinfer.runtime.cli_lines import parse_pool_models
from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.pool import PodState, Pool
from kubeinfer.runtime.router.replicas import Replica, ReplicaSet
from kubeinfer.runtime.router.settings import RouterSettings
from kubeinfer.runtime.pool_launcher import sleep_level
from support import free_port_run, metric_value, scrape_metrics, spawned_children, stop_process, wait_for

MODELS = ("alpha", "beta")
PROMPTS = ["Kubernetes runs containers", "The key and value cache keeps", "Numbers: 0 1 2 3 4 5", "A pod is"]
TOKENS = 8
KV_GIB = "0.0625"
STOP_WITHIN = 60        # the engines' drain (nothing in flight) and exit
QUEUE_TIMEOUT = "120"   # a swap is two engine calls of well under a second each here: the bound is for a busy box


def big_llama(path: Path, seed: int) -> Path:
    """A random Llama with ~110 MB of weights, so that sleeping one shows in its memory."""
    import transformers as tf
    from kubeinfer.runtime.demo import save_tokenizer, train_tokenizer
    import torch
    tokenizer = train_tokenizer(vocab_size=384)
    config = tf.LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=512, intermediate_size=1536,
                            num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                            max_position_embeddings=512, eos_token_id=tokenizer.token_to_id("<|endoftext|>"))
    torch.manual_seed(seed)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)[1]) * 1024


def tree_rss(pid: int) -> int:
    """The engine server and its engine process (a child)."""
    return rss_bytes(pid) + sum(rss_bytes(child) for child in spawned_children(pid))


@dataclass
class PoolEngine:
    """One model's `kubeinfer serve`, a child of the `kubeinfer pool` launcher."""
    url: str
    port: int
    pid: int


def engine_of(launcher: int, name: str) -> int:
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for child in (task / "children").read_text().split():
            if f"--served-model-name\0{name}\0" in Path(f"/proc/{child}/cmdline").read_text():
                return int(child)
    raise AssertionError(f"no engine of {name} under the launcher")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """`kubeinfer pool` with both models, one awake (the last: beta), as a pool pod runs them."""
    root = tmp_path_factory.mktemp("pool")
    port = free_port_run(len(MODELS))
    members = [arg for seed, name in enumerate(MODELS) for arg in ("--member", f"{name}={big_llama(root / name, seed)}")]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KUBEINFER_")}
    log = root / "pool.log"
    launcher = subprocess.Popen(
        [sys.executable, "-P", "-m", "kubeinfer.runtime.cli", "pool", *members, "--max-awake", "1", "--host",
         "127.0.0.1", "--port", str(port), "--", "--max-model-len", "256", "--cpu-threads", "1",
         "--kv-cache-memory-gib", KV_GIB], env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: launcher.poll() is not None or sleep_level(port + 1) == 0, 180, "the pool's last model")
        assert launcher.poll() is None, log.read_text()[-3000:]
        yield launcher, {name: PoolEngine(f"http://127.0.0.1:{port + i}", port + i, engine_of(launcher.pid, name))
                         for i, name in enumerate(MODELS)}
    finally:
        stop_process(launcher, timeout_s=60)


@pytest.fixture(scope="module")
def engines(launched) -> dict[str, PoolEngine]:
    return launched[1]


def complete(client: openai.OpenAI, model: str, prompt: str) -> str:
    return client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text


@pytest.fixture(scope="module")
def expected(engines) -> dict[tuple[str, str], str]:
    """Each model's own answers, asked of it directly, awake."""
    answers = {(name, prompt): complete(openai.OpenAI(base_url=server.url + "/v1", api_key="none"), name, prompt)
               for name, server in engines.items() for prompt in PROMPTS}
    assert answers[MODELS[0], PROMPTS[0]] != answers[MODELS[1], PROMPTS[0]]   # two models: which answered shows
    return answers


@pytest.fixture(scope="module")
def memory_bound(engines, expected) -> int:
    """Halfway between both models awake and one awake with the other asleep (the larger of the two ways round),
    measured; then `alpha` awake and `beta` asleep, as the pool starts."""
    both_awake = sum(tree_rss(s.pid) for s in engines.values())
    one_awake = 0
    for name, server in engines.items():
        httpx.post(server.url + "/wake_up", timeout=60).raise_for_status()
        other = next(s for n, s in engines.items() if n != name)
        httpx.post(other.url + "/sleep?level=1", timeout=60).raise_for_status()
        one_awake = max(one_awake, sum(tree_rss(s.pid) for s in engines.values()))
    httpx.post(engines["beta"].url + "/sleep?level=1", timeout=60).raise_for_status()
    httpx.post(engines["alpha"].url + "/wake_up", timeout=60).raise_for_status()
    assert both_awake - one_awake > 80 << 20   # a model's weights: what the bound tells apart
    return (both_awake + one_awake) // 2


SCRAPE_TIMEOUT = 60   # seconds: one /metrics scrape of a busy engine


def sleep_state(server: PoolEngine, name: str) -> tuple[float, float]:
    """(sleep level, sleeps since start) from the engine's /metrics."""
    text = httpx.get(server.url + "/metrics?name[]=kubeinfer_engine_sleep_level&name[]=kubeinfer_engine_sleeps_total",
                     timeout=SCRAPE_TIMEOUT).text
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    return (metric_value(samples, "kubeinfer_engine_sleep_level", model_name=name),
            metric_value(samples, "kubeinfer_engine_sleeps_total", model_name=name))


class Observer:
    """Watches both engines, and their processes' memory, until stopped. Both awake at once is counted only when
    proven: the first engine awake before and after the second was seen awake, and no sleep of it completed
    between (two answers in turn could otherwise straddle a swap)."""

    def __init__(self, engines: dict[str, PoolEngine]):
        self.engines, self.both_awake, self.rss_peak, self.samples = engines, 0, 0, 0
        self.stopped = threading.Event()
        self.sampled, self.ended = threading.Condition(), False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        (first, one), (second, other) = self.engines.items()
        try:
            while not self.stopped.wait(0.005):
                before = sleep_state(one, first)
                between = sleep_state(other, second)
                after = sleep_state(one, first)
                if before[0] == after[0] == between[0] == 0 and before[1] == after[1]:
                    self.both_awake += 1
                self.rss_peak = max(self.rss_peak, sum(tree_rss(s.pid) for s in self.engines.values()))
                with self.sampled:
                    self.samples += 1
                    self.sampled.notify_all()
        finally:
            with self.sampled:
                self.ended = True
                self.sampled.notify_all()

    def await_sample(self) -> None:
        """Returns once a sample that began after this call is taken: each phase of a test is seen at least once,
        however slowly the box lets this thread run. Bounded by the sample's own three scrapes' timeouts."""
        with self.sampled:
            wanted = self.samples + 2   # the one in progress may have begun before the call
            assert self.sampled.wait_for(lambda: self.samples >= wanted or self.ended,
                                         timeout=2 * (3 * SCRAPE_TIMEOUT + 5)), "the observer took no sample"
            assert not self.ended, "the observer stopped (see its thread's exception above)"

    def __enter__(self) -> "Observer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


@pytest.fixture
def pool_router(engines, expected, memory_bound, start_router):
    ports = [arg for name in MODELS for arg in ("--pool-model", f"{name}={engines[name].port}")]
    router = start_router(["http://127.0.0.1"], *ports, "--pool-max-awake", "1", "--queue-timeout", QUEUE_TIMEOUT,
                          "--scrape-interval", "0.05")
    return router.wait_up(len(MODELS))


def test_requests_alternating_between_two_models_each_get_their_own_answer(engines, expected, memory_bound,
                                                                          pool_router):
    client = openai.OpenAI(base_url=pool_router.url + "/v1", api_key="none")
    with Observer(engines) as observer:
        for round_ in range(3):
            for name in MODELS:
                prompt = PROMPTS[round_]
                assert complete(client, name, prompt) == expected[name, prompt]
                observer.await_sample()   # the engines seen in each of the six phases (both awake: never)
    assert observer.both_awake == 0
    assert observer.rss_peak <= memory_bound, f"{observer.rss_peak / 2**20:.0f} > {memory_bound / 2**20:.0f} MiB"
    # alpha awake at the start, then beta, alpha, beta, alpha, beta woken, each after the other was put to sleep
    assert pool_router.metric("kubeinfer_router_pool_wakeups_total", model="beta") == 3
    assert pool_router.metric("kubeinfer_router_pool_wakeups_total", model="alpha") == 2
    assert pool_router.metric("kubeinfer_router_pool_sleeps_total", model="alpha") == 3
    assert pool_router.metric("kubeinfer_router_pool_model_awake", model="beta", pod="127.0.0.1") == 1
    assert pool_router.metric("kubeinfer_router_pool_model_awake", model="alpha", pod="127.0.0.1") == 0


def test_no_stream_is_lost_while_the_pool_swaps(engines, expected, pool_router):
    client = openai.AsyncOpenAI(base_url=pool_router.url + "/v1", api_key="none", max_retries=0)

    async def stream(name: str, prompt: str) -> str:
        chunks = await client.completions.create(model=name, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        return "".join([chunk.choices[0].text async for chunk in chunks if chunk.choices])

    async def run() -> list[tuple[str, str, str]]:
        asks = [(MODELS[i % 2 if i < 8 else (i // 3) % 2], PROMPTS[i % len(PROMPTS)]) for i in range(16)]
        answers = await asyncio.gather(*(stream(name, prompt) for name, prompt in asks))
        return [(name, prompt, answer) for (name, prompt), answer in zip(asks, answers)]
    with Observer(engines) as observer:
        results = asyncio.run(run())
    assert all(answer == expected[name, prompt] for name, prompt, answer in results)
    assert observer.both_awake == 0
    assert sum(pool_router.metric("kubeinfer_router_pool_waited_requests_total", model=name) for name in MODELS) >= 1


def test_a_model_the_pool_does_not_serve_is_a_404_naming_those_it_does(engines, expected, pool_router):
    answer = httpx.post(pool_router.url + "/v1/completions", json={"model": "gamma", "prompt": "x"}, timeout=30)
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and "'alpha', 'beta'" in error["message"]
    listed = httpx.get(pool_router.url + "/v1/models", timeout=30).json()["data"]
    assert [model["id"] for model in listed] == list(MODELS)
    wait_for(lambda: metric_value(scrape_metrics(pool_router.url), "kubeinfer_router_replicas_up") == 2, 10,
             "both engines up")


def test_sigterm_stops_every_engine_of_the_pool_and_the_launcher_exits_zero(launched):
    """Last of the module's tests on the pool: it stops it."""
    launcher, engines = launched
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(STOP_WITHIN) == 0
    assert not any(Path(f"/proc/{engine.pid}").exists() for engine in engines.values())   # stopped and waited for


@pytest.mark.parametrize("items, message", [
    (["alpha"], "expected NAME=PORT"), (["alpha=x"], "expected NAME=PORT"),
    (["alpha=8001", "alpha=8002"], "given twice")])
def test_pool_model_flags_are_checked(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_pool_models(items)


@pytest.mark.parametrize("fields, message", [
    ({"pool_models": {"a": 8001, "b": 8001}}, "a port of its own"),
    ({"pool_models": {"a": 70000}}, "a port of its own"),
    ({"pool_models": {"a": 8001}, "pool_max_awake": 0}, "--pool-max-awake must be >= 1"),
    ({"pool_models": {"a": 8001}, "pool_sleep_level": 3}, "--pool-sleep-level must be 1 or 2"),
    ({"pool_models": {"a": 8001}, "lora_modules": {"x": "/x"}}, "does not go with --lora-modules"),
    ({"pool_models": {"a": 8001}, "served_model_name": "a"}, "does not go with --pool-model")])
def test_pool_settings_are_checked(fields, message):
    with pytest.raises(ConfigError, match=message):
        RouterSettings(["http://10.0.0.1"], **fields)


def engine(url: str, level: int, in_flight: int = 0) -> Replica:
    return Replica(url, up=True, sleep_level=level, in_flight=in_flight, model_name="m")


def test_a_model_wakes_where_it_costs_least():
    """Awake engines first; else a pod with a free slot; else the pod whose least recently used model is oldest."""
    pods = {"a": {"m": engine("http://10.0.0.1:1", 1), "n": engine("http://10.0.0.1:2", 0)},
            "b": {"m": engine("http://10.0.0.2:1", 1), "n": engine("http://10.0.0.2:2", 0)}}
    sets = {model: ReplicaSet([]) for model in ("m", "n")}
    for model, replicas in sets.items():
        replicas.replicas = {pods[p][model].url: pods[p][model] for p in pods}
    pool = Pool(sets, {"m": 1, "n": 2}, max_awake=1, sleep_level=1, metrics=RouterMetrics(), timeout=1.0)
    asleep = [pods["a"]["m"], pods["b"]["m"]]
    pool.pods["10.0.0.1"] = PodState(used_at={pods["a"]["n"].url: 20.0})
    pool.pods["10.0.0.2"] = PodState(used_at={pods["b"]["n"].url: 10.0})
    assert pool.candidates(asleep) == [pods["b"]["m"]]   # b's awake model was used longest ago
    pool.pods["10.0.0.2"].leaving.add(pods["b"]["n"].url)
    assert pool.candidates([pods["b"]["n"], pods["a"]["n"]]) == [pods["a"]["n"]]   # b's is being put to sleep
    pods["a"]["n"].sleep_level = 1   # a has a free slot now
    assert pool.candidates(asleep) == [pods["a"]["m"]]
