"""A prefill replica's engine stepping on a thread of the test process, and a decode engine driven to the end of its
requests: the two roles of disaggregated serving, with real sockets on 127.0.0.1 between them."""
import contextlib
import socket
import threading
import time

from kubeinfer.runtime.disagg.wire import Kind, check_preamble, read_header, read_json, send_json, send_preamble
from kubeinfer.runtime.llm import LLM


def engine(model_dir, **settings) -> LLM:
    """An engine with one torch thread: the tests run two or three in one process on a box of two cores, where two
    threads each oversubscribe it (a tiny model's step measured 20x slower so on a busy 2-vCPU box)."""
    return LLM(str(model_dir), **{"cpu_threads": 1, **settings})


@contextlib.contextmanager
def prefill_replica(model_dir, **settings):
    """Yields the prefill engine (`LLM`) while a thread steps it; its KV endpoint is `kv_address(llm)`."""
    llm = engine(model_dir, kv_role="prefill", kv_host="127.0.0.1", **settings)
    stop, failure = threading.Event(), []
    steps = llm.engine

    def loop():
        progress = steps.core.transfer_progress   # set by a pull's arrival or a transfer's progress
        try:
            while not stop.is_set():
                if steps.has_unfinished_requests():
                    steps.step()   # clears it
                    continue
                # Cleared, then checked again, then waited on: a progress left set by the last transfer would make
                # every wait return at once, a spinning thread that took the GIL from the decode engine beside it
                # (a 24-token test ran 16 s instead of 0.1 s, depending on that race).
                progress.clear()
                if not steps.has_unfinished_requests():
                    progress.wait(steps.core.idle_wait_s)
        except BaseException as error:   # surfaced by the test, not lost on a thread
            failure.append(error)

    thread = threading.Thread(target=loop, name="prefill-engine", daemon=True)
    thread.start()
    try:
        yield llm
    finally:
        stop.set()
        thread.join()
        llm.engine.core.kv_exporter.source.close()
    if failure:
        raise failure[0]


def kv_address(llm) -> str:
    return llm.engine.core.kv_exporter.source.address


def pull_in_step(model_dir, prompt, params, block_size: int, idle_s: float, **prefill_settings) -> tuple[LLM, LLM]:
    """(prefill, decode) engines that the test steps itself, in turn: the decode side holds request "0" for `prompt`,
    and its pull has reached the prefill side's exporter. The prefill side computes two blocks a step, so a prompt of
    several blocks is sent over several of its steps."""
    prefill = engine(model_dir, block_size=block_size, max_num_batched_tokens=2 * block_size, kv_role="prefill",
                     kv_host="127.0.0.1", kv_idle_timeout_s=idle_s, **prefill_settings)
    decode = engine(model_dir, block_size=block_size, kv_role="decode", kv_idle_timeout_s=idle_s)
    decode.engine.add_remote_request("0", prompt, params, kv_address(prefill))
    decode.engine.step()   # starts the pull
    exporter = prefill.engine.core.kv_exporter
    assert exporter.progress.wait(idle_s) and exporter.busy   # the pull has arrived
    return prefill, decode


def generate_remote(llm, prompts, params, source: str, on_step=None) -> dict:
    """Runs `prompts` on the decode engine `llm` with their KV pulled from `source`; the final outputs by request id
    (`str(index)`). `on_step(step_number, engine)` runs after every step (cancellations)."""
    decode = llm.engine
    params = params if isinstance(params, list) else [params] * len(prompts)
    for index, (prompt, p) in enumerate(zip(prompts, params)):
        decode.add_remote_request(str(index), prompt, p, source)
    finals, number = {}, 0
    while decode.has_unfinished_requests():
        for output in decode.step():
            if output.finished:
                finals[output.request_id] = output
        number += 1
        if on_step is not None:
            on_step(number, decode)
    return finals


def wait_until_drained(prefill_llm, idle_s: float) -> None:
    """Waits for the prefill replica to end every transfer: a dropped one is noticed at its next send (a block or a
    keepalive, every idle_s / 4), so within idle_s."""
    core = prefill_llm.engine.core
    deadline = time.monotonic() + 2 * idle_s
    while core.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not core.has_unfinished(), f"the prefill replica still has transfers after {2 * idle_s} s"


def fake_prefill(behave) -> str:
    """A one-connection server on 127.0.0.1 whose side of the protocol is `behave(conn)`; its address."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = listener.accept()
        with conn:
            behave(conn)
        listener.close()
    threading.Thread(target=run, daemon=True).start()
    return "127.0.0.1:%d" % listener.getsockname()[1]


def accept_pull(conn, layout) -> None:
    """A fake prefill replica's side of a pull up to its first block: the preambles, the puller's request read, and
    an ACCEPT naming `layout`."""
    send_preamble(conn)
    check_preamble(conn, "the puller")
    _, length, crc = read_header(conn)
    read_json(conn, length, crc)
    send_json(conn, Kind.ACCEPT, {"layout": layout.to_json()})
