"""The router's disaggregated mode without a network: which requests go disaggregated, the decode pick, what counts as
a failed transfer, and a client's KV source dropped."""
import json

import pytest

from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.router.affinity import Weights
from kubeinfer.runtime.router.disagg import eligible, is_transfer_failure, pick_decode, strip_source
from kubeinfer.runtime.router.replicas import Replica
from kubeinfer.runtime.router.settings import RouterSettings
from kubeinfer.runtime.server.errors import error_body

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.mark.parametrize("path, body, adapter, expected", [
    (COMPLETIONS, {"prompt": "hi", "stream": True}, None, True),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": [{}], "tool_choice": "auto"}, None, True),
    (COMPLETIONS, {"prompt": [1, 2, 3]}, None, True),
    (COMPLETIONS, {"prompt": ["a", "b"]}, None, False),                    # a batch of prompts
    (COMPLETIONS, {"prompt": "hi", "n": 2}, None, False),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 1}, None, False),
    (CHAT, {"messages": [], "logprobs": True}, None, False),
    (CHAT, {"messages": [], "response_format": {"type": "json_object"}}, None, False),
    (CHAT, {"messages": [], "tools": [{}], "tool_choice": "required"}, None, False),
    (COMPLETIONS, {"prompt": "hi"}, "sql-adapter", False),
    (COMPLETIONS, {"prompt": "hi", "kubeinfer_resume": {}}, None, False),
    ("/v1/responses", {"input": "hi"}, None, False),
])
def test_which_requests_go_disaggregated(path, body, adapter, expected):
    assert eligible(path, {"model": "m", **body}, adapter) is expected


def test_the_decode_pick_takes_the_least_loaded_then_the_most_kv_headroom():
    now_scraped = dict(scraped_at=1e12)
    busy = Replica("http://a:1", in_flight=3, kv_usage=0.1, **now_scraped)
    full = Replica("http://b:1", in_flight=0, kv_usage=0.9, **now_scraped)
    roomy = Replica("http://c:1", in_flight=0, kv_usage=0.2, **now_scraped)
    assert pick_decode([busy, full, roomy], Weights(), 1e15) == (roomy, "decode")
    assert pick_decode([busy, full], Weights(), 1e15)[0] is full   # load weighs more than KV use by default
    stale = Replica("http://d:1", kv_usage=0.0, scraped_at=-1e9)
    assert pick_decode([stale, busy], Weights(), 1.0)[0] is busy   # stale data reads as busy


def test_what_counts_as_a_failed_transfer():
    failed = json.dumps(error_body(502, "cannot reach", "kubeinfer_kv_source", "kv_transfer_failed")).encode()
    refused = json.dumps(error_body(400, "logprobs cannot be combined", "kubeinfer_kv_source")).encode()
    other_400 = json.dumps(error_body(400, "max_tokens too large", "max_tokens")).encode()
    assert is_transfer_failure(502, failed) and is_transfer_failure(400, refused)
    assert not is_transfer_failure(400, other_400) and not is_transfer_failure(502, b"bad gateway")
    assert not is_transfer_failure(400, b"not json")


def test_a_clients_kv_source_is_dropped_and_other_bodies_pass_unchanged():
    body = b'{"model": "m", "prompt": "x", "kubeinfer_kv_source": "10.0.0.9:1"}'
    stripped, parsed = strip_source(body, json.loads(body))
    assert parsed == {"model": "m", "prompt": "x"} and json.loads(stripped) == parsed
    plain = b'{"model":"m"}'
    assert strip_source(plain, json.loads(plain)) == (plain, {"model": "m"})
    assert strip_source(b"[1]", [1]) == (b"[1]", [1])


def test_prefill_pool_settings_are_checked():
    settings = RouterSettings(["http://d:1"], prefill_upstreams=["http://p:1/"])
    assert settings.disaggregated and settings.prefill_upstreams == ["http://p:1"]
    assert not RouterSettings(["http://d:1"]).disaggregated
    with pytest.raises(ConfigError, match="both pools"):
        RouterSettings(["http://d:1"], prefill_upstreams=["http://d:1"])
    with pytest.raises(ConfigError, match="one of --prefill-upstream"):
        RouterSettings(["http://d:1"], prefill_upstreams=["http://p:1"], prefill_endpoints_file="/x")
    with pytest.raises(ConfigError, match="--prefill-upstream 'p:1'"):
        RouterSettings(["http://d:1"], prefill_upstreams=["p:1"])
