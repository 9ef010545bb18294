"""LoRA adapters through the router (docs/lora.md, "Router"): the router, in this process, in front of stand-in
replicas that keep the runtime's contract (their /metrics report `kubeinfer_lora_adapter_loaded{adapter}`,
`POST /v1/load_lora_adapter` loads, a request for an adapter not loaded is a 404 `model_not_found`) and record
which adapter each request named and which of them answered it."""
import asyncio
import contextlib

import httpx
import pytest
import uvicorn
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from kubeinfer.runtime.router.app import Router
from kubeinfer.runtime.router.settings import RouterSettings
from support import free_port

BASE = "base"
OFFERED = {"sql": "/cache/adapters/sql", "chat": "/cache/adapters/chat", "broken": "/cache/adapters/broken"}
SCRAPE_INTERVAL = 0.05
# every replica's first scrape ends (up, or failed) within the router's scrape timeout (replicas.py)
SCRAPE_ROUND = max(0.5, 5 * SCRAPE_INTERVAL) + SCRAPE_INTERVAL
QUEUE_TIMEOUT = 10.0   # the router answers every request within this (a replica, a load, or 503)
ANSWER_WITHIN = QUEUE_TIMEOUT + SCRAPE_ROUND   # a stand-in answers at once once the router sends
PROMPT = "You are a SQL assistant for the cluster's inventory database. " * 3


def error(status: int, message: str, kind: str, code: str | None, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}},
                             status=status)


class StandInReplica:
    """The runtime's LoRA surface without a model. `waiting`: the queue its /metrics reports (the router's load
    signal); `loads_held`: cleared, loads wait until it is set; `reported`: adapters /metrics claims, if not the
    loaded ones (a replica that dropped one since the router's last scrape)."""

    def __init__(self, name: str, loaded=(), waiting: int = 0, broken=(), keys: set[str] | None = None):
        self.name, self.loaded, self.waiting, self.broken, self.keys = name, set(loaded), waiting, set(broken), keys
        self.reported: set[str] | None = None
        self.loads: list[tuple[dict, str | None]] = []   # (body, Authorization) of each load asked
        self.served: list[str] = []                      # the `model` of each request answered 200
        self.loads_held = asyncio.Event()
        self.loads_held.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        return app

    def refused_key(self, request: web.Request) -> web.Response | None:
        if self.keys is not None and request.headers.get("authorization") not in {f"Bearer {k}" for k in self.keys}:
            return error(401, "missing or invalid API key", "authentication_error", "invalid_api_key")
        return None

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [f'kubeinfer_num_requests_waiting{{model_name="{BASE}"}} {self.waiting}',
                 f'kubeinfer_num_requests_running{{model_name="{BASE}"}} 0',
                 f'kubeinfer_kv_cache_usage_ratio{{model_name="{BASE}"}} 0.1']
        lines += [f'kubeinfer_lora_adapter_loaded{{adapter="{a}"}} 1' for a in sorted(
            self.loaded if self.reported is None else self.reported)]
        return web.Response(text="\n".join(lines) + "\n")

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.loads.append((body, request.headers.get("authorization")))
        await self.loads_held.wait()
        if (refused := self.refused_key(request)) is not None:
            return refused
        if body["lora_name"] in self.broken:
            return error(400, f"no adapter_config.json in {body['lora_path']}", "invalid_request_error", None)
        self.loaded.add(body["lora_name"])
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def complete(self, request: web.Request) -> web.Response:
        if (refused := self.refused_key(request)) is not None:
            return refused
        model = (await request.json())["model"]
        if model != BASE and model not in self.loaded:
            return error(404, f"model {model!r} is not served here", "not_found_error", "model_not_found", "model")
        self.served.append(model)
        return web.json_response({"replica": self.name, "model": model})


@contextlib.asynccontextmanager
async def fleet(*replicas: StandInReplica, **settings):
    """The stand-ins served on loopback, and the router in front of them once it has scraped every one: yields an
    httpx client whose base URL is the router's."""
    runners = []
    for replica in replicas:
        runner = web.AppRunner(replica.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        replica.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        runners.append(runner)
    router = Router(RouterSettings([r.url for r in replicas], scrape_interval=SCRAPE_INTERVAL,
                                   queue_timeout=QUEUE_TIMEOUT, lora_modules=OFFERED, **settings))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(router, host="127.0.0.1", port=port, lifespan="on", log_level="warning",
                                           http="httptools"))
    serving = asyncio.ensure_future(server.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=ANSWER_WITHIN) as client:
            await until(lambda: server.started and len(router.replicas.available()) == len(replicas),
                        "the router serving with every replica scraped", SCRAPE_ROUND + 1.0)
            yield client
    finally:
        server.should_exit = True
        await serving
        for runner in runners:
            await runner.cleanup()


async def until(predicate, what: str, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


async def metric(client: httpx.AsyncClient, name: str, **labels) -> float:
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


async def until_metric(client: httpx.AsyncClient, name: str, value: float, timeout_s: float, **labels) -> None:
    async with asyncio.timeout(timeout_s):
        while await metric(client, name, **labels) != value:
            await asyncio.sleep(0.01)


def complete(client: httpx.AsyncClient, model: str, prompt: str = PROMPT, key: str | None = None):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4}, headers=headers)


async def test_requests_for_a_loaded_adapter_go_to_the_replica_that_has_it_even_when_it_is_the_busiest():
    busy_sql = StandInReplica("busy-sql", loaded={"sql"}, waiting=6)
    idle = StandInReplica("idle")
    chat = StandInReplica("chat", loaded={"chat"}, waiting=3)
    async with fleet(busy_sql, idle, chat) as client:
        answers = await asyncio.gather(*(complete(client, "sql", f"{PROMPT} question {i}") for i in range(6)))
        assert [a.json()["replica"] for a in answers] == ["busy-sql"] * 6
        assert {a.headers["x-kubeinfer-replica"] for a in answers} == {busy_sql.url}
        assert (await complete(client, "chat")).json()["replica"] == "chat"
        assert (await complete(client, BASE)).json()["replica"] == "idle"   # the base model: the least loaded
        assert [r.loads for r in (busy_sql, idle, chat)] == [[], [], []]
        assert await metric(client, "kubeinfer_router_lora_adapter_replicas", adapter="sql") == 1
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        assert list(listed) == [BASE, *OFFERED]
        assert listed["sql"]["parent"] == BASE and listed["sql"]["root"] == OFFERED["sql"]


async def test_concurrent_requests_for_an_unloaded_adapter_load_it_once_on_the_least_loaded_replica():
    fleet_of = [StandInReplica("a", waiting=4), StandInReplica("b", waiting=1), StandInReplica("c", waiting=6)]
    least_loaded = fleet_of[1]
    least_loaded.loads_held.clear()
    async with fleet(*fleet_of) as client:
        asked = [asyncio.ensure_future(complete(client, "sql", f"{PROMPT} question {i}", key="k1"))
                 for i in range(8)]
        # every request is at the router, waiting on the one load, before the replica answers it
        await until_metric(client, "kubeinfer_router_lora_load_waiting_requests", 8, QUEUE_TIMEOUT)
        least_loaded.loads_held.set()
        answers = await asyncio.gather(*asked)
        assert [a.status_code for a in answers] == [200] * 8
        assert [a.json()["replica"] for a in answers] == ["b"] * 8
        assert least_loaded.loads == [({"lora_name": "sql", "lora_path": OFFERED["sql"]}, "Bearer k1")]
        assert fleet_of[0].loads == fleet_of[2].loads == []
        assert (await complete(client, "sql")).json()["replica"] == "b"   # loaded now: no second load
        assert len(least_loaded.loads) == 1
        assert await metric(client, "kubeinfer_router_lora_loads_total", outcome="loaded") == 1
        assert await metric(client, "kubeinfer_router_lora_load_waiting_requests") == 0


async def test_a_refused_load_reaches_every_waiting_client_as_the_replica_wrote_it_and_is_not_remembered():
    replica = StandInReplica("r", broken={"broken"})
    replica.loads_held.clear()
    async with fleet(replica) as client:
        asked = [asyncio.ensure_future(complete(client, "broken")) for _ in range(3)]
        await until_metric(client, "kubeinfer_router_lora_load_waiting_requests", 3, QUEUE_TIMEOUT)
        replica.loads_held.set()
        answers = await asyncio.gather(*asked)
        expected = {"error": {"message": f"no adapter_config.json in {OFFERED['broken']}",
                              "type": "invalid_request_error", "param": None, "code": None}}
        assert [(a.status_code, a.json()) for a in answers] == [(400, expected)] * 3
        assert {a.headers["x-kubeinfer-replica"] for a in answers} == {replica.url}
        assert len(replica.loads) == 1 and replica.served == []
        assert await metric(client, "kubeinfer_router_lora_loads_total", outcome="failed") == 1
        assert (await complete(client, "broken")).status_code == 400   # asked again: the files may be fixed now
        assert len(replica.loads) == 2


async def test_a_model_neither_base_nor_adapter_is_404_model_not_found_from_the_router_itself():
    replica = StandInReplica("r")
    async with fleet(replica, served_model_name=BASE) as client:
        answer = await complete(client, "nope")
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "model_not_found"
        assert answer.json()["error"]["type"] == "not_found_error" and answer.json()["error"]["param"] == "model"
        assert "x-kubeinfer-replica" not in answer.headers
        assert replica.served == [] and replica.loads == []
        assert (await complete(client, BASE)).status_code == 200


async def test_a_replica_that_dropped_its_adapter_since_the_scrape_gets_the_request_placed_again():
    dropped = StandInReplica("dropped", waiting=6)
    dropped.reported = {"sql"}   # its /metrics still says loaded; its engine answers 404
    other = StandInReplica("other")
    async with fleet(dropped, other) as client:
        answer = await complete(client, "sql")
        assert (answer.status_code, answer.json()["replica"]) == (200, "other")
        assert len(other.loads) == 1 and dropped.loads == []
        assert await metric(client, "kubeinfer_router_lora_not_loaded_total") == 1


async def test_a_load_refused_for_one_key_is_asked_again_with_the_key_of_another_waiting_request():
    replica = StandInReplica("r", keys={"good"})
    replica.loads_held.clear()
    async with fleet(replica) as client:
        bad = asyncio.ensure_future(complete(client, "sql", key="bad"))
        await until_metric(client, "kubeinfer_router_lora_load_waiting_requests", 1, QUEUE_TIMEOUT)
        good = asyncio.ensure_future(complete(client, "sql", key="good"))
        await until_metric(client, "kubeinfer_router_lora_load_waiting_requests", 2, QUEUE_TIMEOUT)
        replica.loads_held.set()
        assert (await bad).status_code == 401
        assert ((await good).status_code, replica.served) == (200, ["sql"])
        assert [authorization for _, authorization in replica.loads] == ["Bearer bad", "Bearer good"]


async def test_a_client_that_leaves_while_its_adapter_loads_does_not_cancel_the_load():
    replica = StandInReplica("r")
    replica.loads_held.clear()
    async with fleet(replica) as client:
        leaving = asyncio.ensure_future(complete(client, "sql"))
        await until_metric(client, "kubeinfer_router_lora_load_waiting_requests", 1, QUEUE_TIMEOUT)
        leaving.cancel()   # httpx closes the connection: the router cancels the request
        await until_metric(client, "kubeinfer_router_lora_load_waiting_requests", 0, QUEUE_TIMEOUT)
        replica.loads_held.set()
        await until_metric(client, "kubeinfer_router_lora_loads_total", 1, QUEUE_TIMEOUT, outcome="loaded")
        assert (await complete(client, "sql")).status_code == 200   # the load went on: no second one
        assert len(replica.loads) == 1 and replica.served == ["sql"]


def test_lora_modules_parse_as_the_runtime_flag_and_refuse_bad_values():
    from kubeinfer.runtime.errors import ConfigError
    from kubeinfer.runtime.router.settings import parse_lora_modules

    assert parse_lora_modules(["sql=/cache/sql", "chat=/x=y"]) == {"sql": "/cache/sql", "chat": "/x=y"}
    for values, message in [(["sql"], "expected NAME=PATH"), (["=/p"], "expected NAME=PATH"),
                            (["a=/p", "a=/q"], "given twice")]:
        with pytest.raises(ConfigError, match=message):
            parse_lora_modules(values)
    with pytest.raises(ConfigError, match="base model's served name"):
        RouterSettings(["http://a:1"], served_model_name="sql", lora_modules={"sql": "/cache/sql"})


def test_the_real_router_places_and_loads_adapters_on_real_replicas(llama_dir, tmp_path, start_router):
    """`kubeinfer router --lora-modules` before two real `kubeinfer serve --max-loras` replicas: the first request for
    an adapter has one replica load it, the answer equals the adapter offline, the next request goes to that replica
    without a second load, and the replicas' own metrics show it loaded on exactly one of them."""
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    from support import RuntimeServer, metric_value, scrape_metrics
    from support.lora import make_adapter

    adapter = make_adapter(llama_dir, tmp_path / "sql", rank=8, seed=3)
    offline = LLM(str(llama_dir), max_loras=1)
    offline.load_lora("sql", str(adapter))
    want = offline.generate("SELECT name FROM", SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                                                lora_name="sql"))[0].text
    servers = [RuntimeServer(llama_dir, tmp_path / f"replica{i}.log", "--max-model-len", "256", "--cpu-threads", "1",
                             "--max-loras", "2") for i in range(2)]
    try:
        urls = [server.wait_ready().url for server in servers]
        router = start_router(urls, "--lora-modules", f"sql={adapter}", "--served-model-name", "tiny").wait_up(2)
        body = {"model": "sql", "prompt": "SELECT name FROM", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        first = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
        assert first.status_code == 200, first.text
        assert first.json()["choices"][0]["text"] == want
        holder = first.headers["x-kubeinfer-replica"]
        second = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
        assert second.headers["x-kubeinfer-replica"] == holder
        loaded = [metric_value(scrape_metrics(url), "kubeinfer_lora_adapter_loaded", model_name="tiny", adapter="sql")
                  for url in urls]
        assert sorted(loaded) == [0, 1]
        assert router.metric("kubeinfer_router_lora_loads_total", outcome="loaded") == 1
    finally:
        for server in servers:
            server.stop()
