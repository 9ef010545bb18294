"""What the router reads from a replica's /metrics, and how its own loads of adapters meet later scrapes."""
import time

from kubeinfer.runtime.router.replicas import Replica, parse_gauges

EXPOSITION = """# HELP kubeinfer_num_requests_running Requests in the running batch
# TYPE kubeinfer_num_requests_running gauge
kubeinfer_num_requests_running{model_name="tiny"} 3.0
kubeinfer_num_requests_waiting{model_name="tiny"} 7.0
kubeinfer_kv_cache_usage_ratio{model_name="tiny"} 0.5
kubeinfer_num_requests_waiting_other{model_name="tiny"} 99.0
vllm:num_requests_waiting{model_name="tiny"} 7.0
kubeinfer_prefix_cache_hits_total{model_name="tiny"} 12.0
"""

ADAPTERS = """# TYPE kubeinfer_lora_adapter_loaded gauge
kubeinfer_lora_adapter_loaded{adapter="sql"} 1.0
kubeinfer_lora_adapter_loaded{model_name="tiny",adapter="chat-v2"} 1
kubeinfer_lora_adapter_loaded{adapter="gone"} 0.0
kubeinfer_lora_adapter_loaded{adapter="odd \\"name\\" \\\\ here"} 1.0
kubeinfer_lora_adapter_loaded{base_adapter="not-a-name"} 1.0
kubeinfer_lora_requests_running{adapter="other"} 1.0
"""


def test_parse_gauges_reads_the_three_gauges_and_the_model_name():
    values, model, adapters, kv_port, kv_role = parse_gauges(EXPOSITION)
    assert values == {"running": 3.0, "waiting": 7.0, "kv_usage": 0.5}
    assert model == "tiny"
    assert adapters == set() and kv_port is None and kv_role is None


def test_parse_gauges_reads_the_adapters_loaded_at_one_with_escaped_names():
    values, model, adapters, _, _ = parse_gauges(EXPOSITION + ADAPTERS)
    assert adapters == {"sql", "chat-v2", 'odd "name" \\ here'}
    assert values == {"running": 3.0, "waiting": 7.0, "kv_usage": 0.5}


def test_parse_gauges_of_an_unrelated_exposition_is_empty():
    assert parse_gauges("# nothing\nup 1\n") == ({}, None, set(), None, None)


def test_parse_gauges_reads_a_prefill_replicas_kv_port_and_the_endpoint_is_its_host_with_it():
    roles = ('kubeinfer_kv_role{kv_port="9100",model_name="tiny",role="prefill"} 1.0\n'
             'kubeinfer_kv_role{kv_port="",model_name="tiny",role="decode"} 0.0\n')
    assert parse_gauges(EXPOSITION + roles)[3:] == (9100, "prefill")
    decode = 'kubeinfer_kv_role{kv_port="",model_name="tiny",role="decode"} 1.0\n'
    assert parse_gauges(EXPOSITION + decode)[3:] == (None, "decode")
    replica = Replica("http://10.0.0.7:8000", kv_port=9100)
    assert replica.kv_endpoint == "10.0.0.7:9100" and Replica("http://10.0.0.7:8000").kv_endpoint is None


def test_an_adapter_the_router_loaded_survives_a_scrape_begun_before_the_load_but_not_a_later_one():
    replica = Replica("http://10.0.0.1:8000")
    before = time.monotonic()
    replica.note_loaded("sql")
    replica.note_scraped_adapters({"chat"}, scrape_started=before)   # that scrape could not have seen the load
    assert replica.adapters == {"sql", "chat"}
    replica.note_scraped_adapters({"chat"}, scrape_started=time.monotonic())   # it began after: it is the truth
    assert replica.adapters == {"chat"}
    replica.note_unloaded("chat")
    assert replica.adapters == set()


def test_a_replica_that_never_came_up_logs_its_first_failed_scrape_once(caplog):
    """A replica the router cannot reach at all (no route from its pod) must show in its log, once; mark_down alone
    logs only an up -> down change."""
    import asyncio
    import logging
    import socket

    from kubeinfer.runtime.router.replicas import ReplicaSet

    with socket.socket() as sock:   # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def scrape_three_times() -> ReplicaSet:
        replicas = ReplicaSet([url], connect_timeout=0.5)
        for _ in range(3):
            await replicas._scrape(replicas.replicas[url], 0.5)
        replicas.close()
        return replicas
    with caplog.at_level(logging.WARNING, logger="kubeinfer.runtime.router.replicas"):
        replicas = asyncio.run(scrape_three_times())
    lines = [r.getMessage() for r in caplog.records if url in r.getMessage()]
    assert len(lines) == 1 and "not up yet: scrape failed" in lines[0], lines
    assert not replicas.replicas[url].up
