"""The engine core's busy loop, in a process of its own (the default) or on a thread of the API process.

The messages it takes and sends are typed, one dataclass each, in `engine/messages.py` (the contract with
`server/engine_client.py`); an unknown message is a broken contract: the loop raises, and the engine ends saying so.

The loop takes every waiting message, runs one step if any request is unfinished, and sends that step's deltas in one
StepOutput; with nothing to do, or MAX_STEPS_AHEAD steps unread, it blocks on the channel. In a process it ignores
SIGINT and SIGTERM (sent to the whole process group by a terminal or a test): the API process drains first, then
sends Shutdown. If the API process dies, the pipe closes and the loop ends.

A PutToSleep waits for the requests in flight to finish (those that arrive meanwhile run too); a WakeUp cancels the
sleeps still waiting. A request that arrives while the engine sleeps wakes it (a Woke with no number).
"""
import gc
import logging
import signal
import sys
import time

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.messages import (AbortRequests, AddRemoteRequest, AddRequest, EngineFailed, LoraDone,
                                               LoraOperation, PutToSleep, Ready, RequestFailed, Rejected, Shutdown,
                                               Slept, StepOutput, StepsRead, StopRequest, ToEngine, TransferFailed,
                                               WakeUp, Woke)
from kubeinfer.runtime.errors import InvalidRequestError, KubeinferError

logger = logging.getLogger(__name__)
# Steps the core may run ahead of the API side. Two: it computes the next step while the API side streams
# the last one. Unbounded, an API process slower than the engine (many streams on few cores) would fall
# further behind every step: tokens would reach clients late, and an abort would arrive after the request
# it cancels had already run to its end (seen: 5 of 50 cancelled streams of tests/runtime/server/test_load.py).
MAX_STEPS_AHEAD = 2


def serve_core(core, channel) -> None:
    unread = 0   # steps sent that the API side has not yet said it read
    sleeps: list[PutToSleep] = []   # the sleeps waiting for the engine to be idle
    while True:
        touched = False
        idle = not core.has_unfinished() or unread >= MAX_STEPS_AHEAD
        for message in channel.receive(timeout=core.idle_wait_s if idle else 0.0):   # a KV source polls
            match message:
                case Shutdown():
                    return
                case StepsRead():
                    unread -= message.num_steps
                case _:
                    touched = True
                    apply_message(core, channel, message, sleeps)
        for figures in core.request_wakes:
            channel.send(Woke(None, figures))
        core.request_wakes.clear()
        if core.has_unfinished() and unread < MAX_STEPS_AHEAD:
            started = time.perf_counter()
            deltas = core.step()
            stats = core.stats(fresh=not core.has_unfinished())   # the last step before idling: exact counts
            channel.send(StepOutput(deltas, stats, time.perf_counter() - started, core.step_tenant_tokens))
            unread += 1
            if core.kv_importer is not None:
                for request_id, why in core.kv_importer.take_failures():
                    channel.send(TransferFailed(request_id, why))
            for request_id, why in core.take_failures():
                channel.send(RequestFailed(request_id, why))
        elif touched:   # the gauges, after aborts or stops with no step to follow
            channel.send(StepOutput([], core.stats(fresh=not core.has_unfinished()), None, {}))
        if sleeps and not core.has_unfinished():
            sleep_when_idle(core, channel, sleeps)


def apply_message(core, channel, message: ToEngine, sleeps: list[PutToSleep]) -> None:
    """Does what a message from the API side asks (the loop itself takes Shutdown and StepsRead)."""
    match message:
        case AddRequest():
            try:
                core.add(message.request_id, message.token_ids, message.params, message.arrival_time,
                         message.resumed_token_ids)
            except InvalidRequestError as error:
                channel.send(Rejected(message.request_id, str(error)))
        case AddRemoteRequest():
            try:
                core.add_remote(message.request_id, message.token_ids, message.params, message.kv_source,
                                message.arrival_time)
            except InvalidRequestError as error:
                channel.send(Rejected(message.request_id, str(error)))
        case AbortRequests():
            for request_id in message.request_ids:
                core.finish(request_id, "abort")
        case StopRequest():
            core.finish(message.request_id, "stop", message.stop)
        case LoraOperation():
            channel.send(LoraDone(message.number, lora_operation(core, message.operation, message.name, message.path)))
        case PutToSleep():
            sleeps.append(message)
        case WakeUp():
            for sleep in sleeps:
                channel.send(Slept(sleep.number, "cancelled: a wake_up came before the engine was idle", None))
            sleeps.clear()
            channel.send(Woke(message.number, core.wake_up()))
        case _:
            raise TypeError(f"the engine got a message it does not know: {message!r}")


def sleep_when_idle(core, channel, sleeps: list[PutToSleep]) -> None:
    """Puts the idle engine to sleep at the deepest level asked, and answers each sleep asked."""
    figures, error = None, None
    try:
        figures = core.sleep(max(sleep.level for sleep in sleeps))
    except InvalidRequestError as error_:
        error = str(error_)
    for sleep in sleeps:
        channel.send(Slept(sleep.number, error, figures))
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
    """Builds the core, says Ready (or why not), and serves until Shutdown; returns an exit code."""
    try:
        from kubeinfer.runtime.engine.core import EngineCore   # torch: only in the engine's own process
        core = EngineCore(config, eos_token_ids)
    except KubeinferError as error:
        channel.send(EngineFailed(str(error)))
        return 2
    except Exception as error:   # noqa: BLE001 - e.g. out of memory: reported in one line by the API side
        logger.exception("the engine failed to start")
        channel.send(EngineFailed(f"{type(error).__name__}: {error}"))
        return 1
    try:
        gc.collect()
        gc.freeze()   # start-up objects (the model, the tokenizer) are never garbage: keep them out of collections
        channel.send(Ready(core.info))
        serve_core(core, channel)
        return 0
    except EOFError:
        logger.info("the API side went away; the engine stops")
        return 0
    except BaseException as error:
        logger.exception("engine step failed; the engine stops")
        try:
            channel.send(EngineFailed(f"the engine failed: {type(error).__name__}: {error}"))
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
