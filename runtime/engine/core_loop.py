"""The engine core's busy loop, in a process of its own (the default) or on a thread of the API process.

Messages from the API side:   ("add", request_id, token_ids, params, arrival_time, resumed output token ids),
                              ("add_remote", request_id, token_ids, params, arrival_time, KV source host:port),
                              ("abort", [request_id]),
                              ("stop", request_id, stop_string), ("read", number of step messages read),
                              ("lora", number, "load" | "unload", name, folder), ("sleep", number, level),
                              ("wake", number), ("shutdown",)
Messages to the API side:     ("ready", EngineInfo) once, then ("step", [TokenDelta], EngineStats, seconds,
                              {tenant: tokens computed}) per step, ("rejected", request_id, message),
                              ("lora_done", number, error or None), ("slept", number, error or None,
                              figures or None) once idle, ("woke", number or None (a request woke it), figures),
                              ("transfer_failed", request_id, message)
                              after the step that found a KV pull failed, ("failed", request_id, message) after
                              the step that ended a request with an error (an adapter it could not read),
                              ("error", message) when it dies.

The loop takes every waiting message, runs one step if any request is unfinished, and sends that step's
deltas in one message; with nothing to do, or MAX_STEPS_AHEAD steps unread, it blocks on the channel. In a process it ignores SIGINT and
SIGTERM (sent to the whole process group by a terminal or a test): the API process drains first, then
sends "shutdown". If the API process dies, the pipe closes and the loop ends.

A "sleep" waits for the requests in flight to finish (those that arrive meanwhile run too); a "wake" cancels the
sleeps still waiting. A request that arrives while the engine sleeps wakes it ("woke" with no number).
"""
import gc
import logging
import signal
import sys
import time

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.errors import InvalidRequestError, KubeinferError

logger = logging.getLogger(__name__)
# Steps the core may run ahead of the API side. Two: it computes the next step while the API side streams
# the last one. Unbounded, an API process slower than the engine (many streams on few cores) would fall
# further behind every step: tokens would reach clients late, and an abort would arrive after the request
# it cancels had already run to its end (seen: 5 of 50 cancelled streams of tests/runtime/server/test_load.py).
MAX_STEPS_AHEAD = 2


def serve_core(core, channel) -> None:
    unread = 0   # steps sent that the API side has not yet said it read
    sleeps: list[tuple[int, int]] = []   # (number, level) of the sleeps waiting for the engine to be idle
    while True:
        touched = False
        idle = not core.has_unfinished() or unread >= MAX_STEPS_AHEAD
        for message in channel.receive(timeout=core.idle_wait_s if idle else 0.0):   # a KV source polls
            kind = message[0]
            if kind == "shutdown":
                return
            if kind == "read":
                unread -= message[1]
                continue
            touched = True
            if kind == "add":
                _, request_id, token_ids, params, arrival_time, output_token_ids = message
                try:
                    core.add(request_id, token_ids, params, arrival_time, output_token_ids)
                except InvalidRequestError as error:
                    channel.send(("rejected", request_id, str(error)))
            elif kind == "add_remote":
                _, request_id, token_ids, params, arrival_time, source = message
                try:
                    core.add_remote(request_id, token_ids, params, source, arrival_time)
                except InvalidRequestError as error:
                    channel.send(("rejected", request_id, str(error)))
            elif kind == "abort":
                for request_id in message[1]:
                    core.finish(request_id, "abort")
            elif kind == "stop":
                core.finish(message[1], "stop", message[2])
            elif kind == "lora":
                channel.send(("lora_done", message[1], lora_operation(core, *message[2:])))
            elif kind == "sleep":
                sleeps.append(message[1:])
            elif kind == "wake":
                for number, _ in sleeps:
                    channel.send(("slept", number, "cancelled: a wake_up came before the engine was idle", None))
                sleeps.clear()
                channel.send(("woke", message[1], core.wake_up()))
        for figures in core.request_wakes:
            channel.send(("woke", None, figures))
        core.request_wakes.clear()
        if core.has_unfinished() and unread < MAX_STEPS_AHEAD:
            started = time.perf_counter()
            deltas = core.step()
            stats = core.stats(fresh=not core.has_unfinished())   # the last step before idling: exact counts
            channel.send(("step", deltas, stats, time.perf_counter() - started, core.step_tenant_tokens))
            unread += 1
            if core.kv_importer is not None:
                for request_id, why in core.kv_importer.take_failures():
                    channel.send(("transfer_failed", request_id, why))
            for request_id, why in core.take_failures():
                channel.send(("failed", request_id, why))
        elif touched:   # the gauges, after aborts or stops with no step to follow
            channel.send(("step", [], core.stats(fresh=not core.has_unfinished()), None, {}))
        if sleeps and not core.has_unfinished():
            sleep_when_idle(core, channel, sleeps)


def sleep_when_idle(core, channel, sleeps: list[tuple[int, int]]) -> None:
    """Puts the idle engine to sleep at the deepest level asked, and answers each sleep asked."""
    figures, error = None, None
    try:
        figures = core.sleep(max(level for _, level in sleeps))
    except InvalidRequestError as error_:
        error = str(error_)
    for number, _ in sleeps:
        channel.send(("slept", number, error, figures))
    sleeps.clear()


def lora_operation(core, operation: str, name: str, path: str | None) -> str | None:
    """Loads or unloads an adapter; what went wrong (sent back as the API's 400), or None."""
    try:
        if operation == "load":
            core.load_lora(name, path)
        else:
            core.unload_lora(name)
    except InvalidRequestError as error:
        return str(error)
    return None


def run_core(config: EngineConfig, eos_token_ids: tuple[int, ...], channel) -> int:
    """Builds the core, says "ready" (or why not), and serves until shutdown; returns an exit code."""
    try:
        from kubeinfer.runtime.engine.core import EngineCore   # torch: only in the engine's own process
        core = EngineCore(config, eos_token_ids)
    except KubeinferError as error:
        channel.send(("error", str(error)))
        return 2
    except Exception as error:   # noqa: BLE001 - e.g. out of memory: reported in one line by the API side
        logger.exception("the engine failed to start")
        channel.send(("error", f"{type(error).__name__}: {error}"))
        return 1
    try:
        gc.collect()
        gc.freeze()   # start-up objects (the model, the tokenizer) are never garbage: keep them out of collections
        channel.send(("ready", core.info))
        serve_core(core, channel)
        return 0
    except EOFError:
        logger.info("the API side went away; the engine stops")
        return 0
    except BaseException as error:
        logger.exception("engine step failed; the engine stops")
        try:
            channel.send(("error", f"the engine failed: {type(error).__name__}: {error}"))
        except (OSError, EOFError):
            pass
        return 1
    finally:
        core.shutdown()


def core_process_main(config: EngineConfig, eos_token_ids: tuple[int, ...], conn, log_level: str) -> None:
    """Entry point of the engine process (multiprocessing, spawn)."""
    from kubeinfer.runtime.engine.channels import PipeEnd
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The API process blocks these while it spawns this one (EngineClient.start); a mask survives exec.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    if config.kv_role == "prefill":   # a KV export's spans are made here (disagg/export_trace.py)
        from kubeinfer.runtime import tracing
        tracing.configure("kubeinfer-server")
    sys.exit(run_core(config, eos_token_ids, PipeEnd(conn)))
