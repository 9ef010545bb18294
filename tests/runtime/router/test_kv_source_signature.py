"""The router's signature on a KV-source hint (runtime/disagg/source_signature.py), and a decode replica started
with `--kv-source-key-file` (real processes on 127.0.0.1): a hint without the router's signature, with another
key's, or expired is a 400 naming the signature; through a router holding the key, the request is served
disaggregated and equals the colocated answer; through a router without it, it falls back to colocated."""
import httpx
import pytest

from kubeinfer.runtime.disagg.source_signature import FIELD, SIGNATURE_TTL_S, read_key, sign, verify
from kubeinfer.runtime.errors import ConfigError, InvalidRequestError
from support import RuntimeServer, free_port, wait_for

KEY = b"0123456789abcdef-shared-key"
SOURCE = "10.244.0.7:9100"


def test_a_signature_binds_the_source_the_key_and_a_short_lifetime():
    signature = sign(KEY, SOURCE, now=1000)
    verify(KEY, SOURCE, signature, now=1000)
    verify(KEY, SOURCE, signature, now=1000 + SIGNATURE_TTL_S)
    for key, source, given, now, why in [
        (KEY, "10.244.0.8:9100", signature, 1000, "does not match"),        # another source
        (b"another-key-of-16+bytes", SOURCE, signature, 1000, "does not match"),
        (KEY, SOURCE, signature, 1001 + SIGNATURE_TTL_S, "expired"),
        (KEY, SOURCE, None, 1000, "needs the router's"),
        (KEY, SOURCE, "garbage", 1000, "needs the router's"),
        (KEY, SOURCE, "1060.00", 1000, "does not match"),
    ]:
        with pytest.raises(InvalidRequestError, match=why) as error:
            verify(key, source, given, now=now)
        assert error.value.param == FIELD


def test_the_key_file_must_hold_a_real_key(tmp_path):
    assert read_key(None) is None
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        read_key(str(tmp_path / "short"))
    with pytest.raises(ConfigError, match="cannot be read"):
        read_key(str(tmp_path / "missing"))
    (tmp_path / "key").write_bytes(KEY + b"\n")
    assert read_key(str(tmp_path / "key")) == KEY


@pytest.fixture(scope="module")
def signed(llama_dir, tmp_path_factory):
    """A prefill replica and a decode replica that takes only signed hints."""
    work = tmp_path_factory.mktemp("signed")
    (work / "key").write_bytes(KEY)
    kv_port = free_port()
    serve = ("--max-model-len", "512", "--cpu-threads", "1", "--kv-idle-timeout", "3")
    servers = [RuntimeServer(llama_dir, work / "prefill.log", *serve, "--kv-role", "prefill", "--kv-host",
                             "127.0.0.1", "--kv-port", str(kv_port)),
               RuntimeServer(llama_dir, work / "decode.log", *serve, "--kv-role", "decode",
                             "--kv-source-key-file", str(work / "key"))]
    try:
        yield [server.wait_ready() for server in servers], f"127.0.0.1:{kv_port}", work / "key"
    finally:
        for server in servers:
            server.stop()


def test_a_decode_replica_with_a_key_takes_only_the_routers_signed_hints(signed, start_router):
    (prefill, decode), source, key_file = signed
    body = {"model": "tiny", "prompt": "Signed hints only, and this prompt spans a few KV blocks of the cache.",
            "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    reference = httpx.post(prefill.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    for extra in ({}, {FIELD: sign(b"not-the-router-key-16", source)}):
        answer = httpx.post(decode.url + "/v1/completions", json=body | {"kubeinfer_kv_source": source} | extra,
                            timeout=60)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == FIELD, answer.text
    answer = httpx.post(decode.url + "/v1/completions", timeout=60,
                        json=body | {"kubeinfer_kv_source": source, FIELD: sign(KEY, source)})
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == reference

    with_key = start_router([decode.url], "--prefill-upstream", prefill.url, "--kv-source-key-file",
                            str(key_file)).wait_up(1)
    without = start_router([decode.url], "--prefill-upstream", prefill.url).wait_up(1)
    for router, path in ((with_key, "disaggregated"), (without, "fallback")):
        wait_for(lambda: router.metric("kubeinfer_router_prefill_replicas_up") == 1, 30, "the prefill replica up")
        answer = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == reference, answer.text
        assert router.metric("kubeinfer_router_disaggregation_requests_total", path=path) == 1
