"""Bad wiring and broken transfers, end to end through the engines: the request ends with an error that names the
cause (never a hang), and its blocks are freed on both sides."""
import socket
import time

import pytest

from kubeinfer.runtime.disagg.layout import KVLayout
from kubeinfer.runtime.disagg.wire import BLOCK_INDEX, Kind, send_frame, send_preamble
from kubeinfer.runtime.sampling_params import SamplingParams
from support.blocks import assert_no_leak
from support.disagg import (accept_pull, engine, fake_prefill, generate_remote, kv_address, prefill_replica,
                            wait_until_drained)

BLOCK = 8
IDLE_S = 1.0
PARAMS = SamplingParams(max_tokens=8, temperature=0)
PROMPT = list(range(1, 40))
pytestmark = pytest.mark.timeout(60)


def decode_engine(model_dir, **settings):
    return engine(model_dir, block_size=BLOCK, kv_role="decode", kv_idle_timeout_s=IDLE_S, **settings)


def the_error(finals: dict) -> str:
    (output,) = finals.values()
    assert output.finished and output.finish_reason == "error" and output.token_ids == []
    return output.error


def test_a_decode_replica_of_another_model_is_refused_by_name(llama_dir, model_dirs):
    with prefill_replica(llama_dir, block_size=BLOCK, kv_idle_timeout_s=IDLE_S) as prefill:
        decode = decode_engine(model_dirs["qwen2"])
        error = the_error(generate_remote(decode, [PROMPT], PARAMS, kv_address(prefill)))
        assert "serves another KV layout: model 'llama' on prefill, 'qwen2' on decode" in error
        wait_until_drained(prefill, IDLE_S)
        assert_no_leak(decode)
        assert_no_leak(prefill)


def test_a_closed_port_ends_the_request_at_once(llama_dir):
    with socket.socket() as probe:   # bound, never listening: connections are refused, and no one else gets it
        probe.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % probe.getsockname()[1]
        decode = decode_engine(llama_dir)
        error = the_error(generate_remote(decode, [PROMPT], PARAMS, address))
    assert f"cannot reach the prefill replica's KV port at {address}: connection refused" in error
    assert_no_leak(decode)


def test_a_prefill_replica_of_another_protocol_version_is_named(llama_dir):
    address = fake_prefill(lambda conn: (send_preamble(conn, version=9), time.sleep(IDLE_S)))
    decode = decode_engine(llama_dir)
    error = the_error(generate_remote(decode, [PROMPT], PARAMS, address))
    assert "speaks KV protocol version 9" in error
    assert_no_leak(decode)


def test_a_stalled_prefill_replica_times_out_and_frees_the_blocks(llama_dir):
    address = fake_prefill(lambda conn: time.sleep(3 * IDLE_S))   # accepts, says nothing
    decode = decode_engine(llama_dir)
    started = time.monotonic()
    error = the_error(generate_remote(decode, [PROMPT], PARAMS, address))
    assert "sent nothing for the idle timeout" in error
    assert time.monotonic() - started >= IDLE_S
    assert_no_leak(decode)


def test_a_prefill_replica_that_dies_mid_transfer_frees_the_decode_blocks(llama_dir):
    decode = decode_engine(llama_dir)
    layout = KVLayout.of_cache(decode.engine.config.served_model_name, decode.engine.model_runner.kv_cache)

    def one_block_then_gone(conn):
        accept_pull(conn, layout)
        send_frame(conn, Kind.BLOCK, [BLOCK_INDEX.pack(0), bytes(layout.block_bytes)])
    error = the_error(generate_remote(decode, [PROMPT], PARAMS, fake_prefill(one_block_then_gone)))
    assert "closed the connection" in error
    assert_no_leak(decode)


def test_a_prompt_the_prefill_replica_cannot_take_is_refused_with_its_reason(llama_dir):
    with prefill_replica(llama_dir, block_size=BLOCK, max_model_len=32, kv_idle_timeout_s=IDLE_S) as prefill:
        decode = decode_engine(llama_dir)
        error = the_error(generate_remote(decode, [PROMPT], PARAMS, kv_address(prefill)))
        assert error.startswith("the prefill replica refused the prompt:") and "32" in error
        wait_until_drained(prefill, IDLE_S)
        assert_no_leak(decode)
        assert_no_leak(prefill)
