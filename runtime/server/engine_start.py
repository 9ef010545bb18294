"""Starting the engine core for the API process: in a process of its own (spawned) or on a thread, then waiting
until it has loaded the model and says Ready (or why it could not); and waiting for it to end."""
import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine.channels import PipeEnd, ThreadLink
from kubeinfer.runtime.engine.core_loop import core_process_main, run_core
from kubeinfer.runtime.engine.messages import EngineFailed, EngineInfo, Ready
from kubeinfer.runtime.errors import KubeinferError

logger = logging.getLogger(__name__)
START_PROGRESS_SECONDS = 30.0


class EngineStartError(KubeinferError):
    """The engine could not start (the reason is the message)."""


def spawn_core_process(config: EngineConfig, eos: tuple[int, ...], log_level: str,
                       keep: Callable[[multiprocessing.Process], None]):
    """The channel to the core in a process of its own; `keep(process)` is called before the process starts, so
    that a signal raised at any point after can still find it and kill it."""
    context = multiprocessing.get_context("spawn")
    api_conn, core_conn = context.Pipe(duplex=True)
    process = context.Process(target=core_process_main, name="kubeinfer-engine", daemon=False,
                              args=(config, eos, core_conn, log_level))
    keep(process)
    # A SIGTERM inside start() (after the fork, before it knows the pid) would leave a process that
    # nobody kills: hold it until start() returns.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    core_conn.close()
    return PipeEnd(api_conn)


def start_core_thread(config: EngineConfig, eos: tuple[int, ...]):
    """(thread, channel) of the core on a thread of this process."""
    link = ThreadLink()
    thread = threading.Thread(target=run_core, args=(config, eos, link.core), name="engine", daemon=True)
    thread.start()
    return thread, link.api


def wait_until_ready(channel, worker, mode: str, join: Callable[[], None]) -> EngineInfo:
    """The core's EngineInfo once it is ready (its start-up phases led by the spawn's own); raises EngineStartError
    with its reason if it fails (after `join()`ing it) or ends."""
    started = time.monotonic()
    while True:
        try:
            messages = channel.receive(timeout=START_PROGRESS_SECONDS)
        except EOFError:
            messages = []
        for message in messages:
            if isinstance(message, EngineFailed):
                join()
                raise EngineStartError(message.message)
            if isinstance(message, Ready):
                info = message.info
                # Before the engine's own phases: spawning its process and importing torch there.
                spent = time.monotonic() - started - sum(info.startup_phases.values())
                info.startup_phases = {"engine_spawn": max(spent, 0.0), **info.startup_phases}
                return info
        if not worker.is_alive():
            raise EngineStartError(f"the engine {mode} ended while starting (exit code "
                                   f"{getattr(worker, 'exitcode', None)}); see the log above")
        if not messages:
            logger.info("engine still starting (%.0f s): loading the model", time.monotonic() - started)


def join_core(worker: multiprocessing.Process | threading.Thread | None, timeout: float) -> None:
    """Waits up to `timeout` seconds for the core's process or thread to end; kills a process still running then (it
    ignores SIGTERM). A worker never started, or already ended, is left as it is."""
    if worker is None or not worker.is_alive():
        return
    worker.join(timeout)
    if isinstance(worker, threading.Thread) or not worker.is_alive():
        return
    if timeout:
        logger.warning("the engine process did not stop in %.0f s; killing it", timeout)
    worker.kill()
    worker.join(5)
