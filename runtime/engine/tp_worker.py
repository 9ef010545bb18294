"""Tensor and expert parallelism across processes: rank 0 (the engine process) drives ranks 1..N-1 (workers).

Rank 0 opens a TCPStore on 127.0.0.1 (a free port), spawns one worker process per other rank, and all
ranks join one `torch.distributed` group through it (NCCL on CUDA, gloo on CPU), with a finite timeout.
Each worker builds its own `ModelRunner` shard and loops: wait for its event, read the step's host inputs
from a shared-memory buffer, run the forward (the all-reduces and all-gathers happen inside the layers).
Only rank 0 schedules and samples.

Failure policy: a watchdog thread on rank 0 polls the workers; when one dies it logs which rank and how,
kills the others and ends the engine process with exit status 1, since rank 0 may be waiting in a
collective that would never return. A worker exits as soon as rank 0 is gone (a thread waits on the
parent's process sentinel). Scripts that start a TP engine need the usual `if __name__ == "__main__":`
guard, because workers are started with the "spawn" method.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from kubeinfer.runtime.cpu_threads import cpu_threads
from kubeinfer.runtime.parallel import set_tensor_parallel

if TYPE_CHECKING:
    from kubeinfer.runtime.config import EngineConfig
    from kubeinfer.runtime.engine.step_inputs import StepInputs

logger = logging.getLogger(__name__)
TIMEOUT = timedelta(seconds=120)     # process-group start-up and any single collective
WATCHDOG_INTERVAL_S = 0.2
JOIN_TIMEOUT_S = 10.0
EXIT_STATUS = 1
_HEADER = 8                          # bytes of the message length that precedes each message


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank r of a group on CUDA uses cuda:r; on CPU every rank uses the CPU."""
    device = config.resolve_device()
    if config.world_size > 1 and device == "cuda":
        return torch.device("cuda", rank)
    return torch.device(device)


def _init_process_group(config: EngineConfig, rank: int, store: dist.Store) -> None:
    device = rank_device(config, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                            world_size=config.world_size, timeout=TIMEOUT)
    set_tensor_parallel(config.tensor_parallel_size)


class StepChannel:
    """A shared-memory buffer that rank 0 writes each step's inputs into, and one event per worker.

    Rank 0 overwrites the buffer only after every worker has read it (cleared its event).
    """

    def __init__(self, size: int, num_workers: int, context):
        self.shm = SharedMemory(create=True, size=size + _HEADER)
        self.events = [context.Event() for _ in range(num_workers)]

    def send(self, message: tuple | None, timeout_s: float = TIMEOUT.total_seconds()) -> None:
        """Sends `message` (a tuple of numbers and numpy arrays; None = exit) to every worker."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        # A worker clears its event once it has read the previous message. On CPU the step's collectives
        # already guarantee that; on CUDA a step that samples nothing returns before the workers caught up.
        deadline = time.monotonic() + timeout_s
        while any(event.is_set() for event in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"a tensor-parallel worker did not read its step message in {timeout_s:.0f} s")
            time.sleep(0)
        if len(data) + _HEADER > self.shm.size:
            raise RuntimeError(f"step message of {len(data)} bytes exceeds the {self.shm.size}-byte channel")
        self.shm.buf[:_HEADER] = len(data).to_bytes(_HEADER, "little")
        self.shm.buf[_HEADER:_HEADER + len(data)] = data
        for event in self.events:
            event.set()

    def receive(self, rank: int) -> tuple | None:
        event = self.events[rank - 1]
        event.wait()
        size = int.from_bytes(self.shm.buf[:_HEADER], "little")
        message = pickle.loads(self.shm.buf[_HEADER:_HEADER + size])
        event.clear()
        return message

    def close(self, unlink: bool) -> None:
        self.shm.close()
        if unlink:
            self.shm.unlink()


def channel_size(config: EngineConfig) -> int:
    """Bytes of the largest step message: token-sized int64 arrays, sequence-sized int32 arrays, tables."""
    tokens = max(config.max_num_batched_tokens, config.max_num_seqs)
    seqs = config.max_num_seqs
    return 3 * 8 * tokens + 4 * 8 * (seqs + 1) + 4 * seqs * (config.max_blocks_per_seq + 1) + (1 << 16)


def pack(step: StepInputs) -> tuple:
    return tuple(value.numpy() if isinstance(value, torch.Tensor) else value for value in step.astuple())


def unpack(message: tuple) -> StepInputs:
    from kubeinfer.runtime.engine.step_inputs import StepInputs
    return StepInputs(*(torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in message))


class WorkerGroup:
    """Rank 0's side: starts the workers, joins the process group with them, sends steps, stops them."""

    def __init__(self, config: EngineConfig):
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed group already exists in this process; "
                               "one parallel engine per process")
        size = config.world_size
        context = mp.get_context("spawn")
        self._closed = False
        self._stopping = threading.Event()
        self._num_threads_before = torch.get_num_threads()
        if rank_device(config, 0).type == "cpu":   # ranks share the CPUs instead of each taking them all
            torch.set_num_threads(config.cpu_threads or max(1, cpu_threads() // size))
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
        self.channel = StepChannel(channel_size(config), size - 1, context)
        self.processes = [
            context.Process(target=worker_main, name=f"kubeinfer-tp-rank{rank}", daemon=True,
                            args=(config, rank, store.port, self.channel, torch.get_num_threads(),
                                  logging.getLogger().getEffectiveLevel()))
            for rank in range(1, size)]
        for process in self.processes:
            process.start()
        self._watchdog = threading.Thread(target=self._watch, name="kubeinfer-tp-watchdog", daemon=True)
        self._watchdog.start()
        atexit.register(self.shutdown)
        logger.info("tensor parallel: started ranks 1..%d (pids %s), joining the group on 127.0.0.1:%d",
                    size - 1, ", ".join(str(p.pid) for p in self.processes), store.port)
        try:
            _init_process_group(config, 0, store)
        except BaseException:
            self.shutdown()
            raise
        self._store = store

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..N-1, in rank order."""
        return [process.pid for process in self.processes]

    def send(self, step: StepInputs) -> None:
        self.channel.send(pack(step))

    def control(self, message: dict) -> None:
        """Sends every worker `{"sleep": level}` or `{"wake": True}` (engine/sleep.py); each does it before its next
        step message, and the step's collectives wait for all."""
        self.channel.send(message)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Wraps rank 0's part of a step: a collective that fails because a worker died ends the process
        the same way the watchdog does (gloo notices a closed peer before the watchdog's next poll)."""
        try:
            yield
        except Exception:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                for rank, process in enumerate(self.processes, 1):
                    if process.exitcode is not None:
                        self._die(rank, process)
                time.sleep(WATCHDOG_INTERVAL_S / 4)
            raise

    def shutdown(self) -> None:
        """Stops the workers (asks, then waits, then kills) and leaves the process group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self._stopping.set()
        self._watchdog.join()
        dead = [(rank, p) for rank, p in enumerate(self.processes, 1) if p.exitcode is not None]
        for rank, process in dead:
            logger.error("tensor-parallel rank %d (pid %d) %s before shutdown", rank, process.pid,
                         _describe_exit(process.exitcode))
        if dead:   # the others may be inside a collective that will never complete
            for process in self.processes:
                process.kill()
        else:
            try:
                self.channel.send(None, timeout_s=JOIN_TIMEOUT_S)
            except TimeoutError:
                logger.warning("a tensor-parallel worker is not reading its messages; it will be killed")
        for rank, process in enumerate(self.processes, 1):
            process.join(JOIN_TIMEOUT_S)
            if process.exitcode is None:
                logger.warning("tensor-parallel rank %d did not stop in %.0f s; killing it", rank, JOIN_TIMEOUT_S)
                process.kill()
                process.join()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.channel.close(unlink=True)
        torch.set_num_threads(self._num_threads_before)
        logger.info("tensor parallel: workers stopped")

    def _watch(self) -> None:
        while not self._stopping.wait(WATCHDOG_INTERVAL_S):
            for rank, process in enumerate(self.processes, 1):
                if process.exitcode is not None:
                    self._die(rank, process)

    def _die(self, rank: int, process) -> None:
        logger.critical("tensor-parallel rank %d (pid %d) %s; the engine cannot run without it: "
                        "stopping the other ranks and exiting with status %d",
                        rank, process.pid, _describe_exit(process.exitcode), EXIT_STATUS)
        for other in self.processes:
            if other.exitcode is None:
                other.kill()
        self.channel.shm.unlink()
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_STATUS)


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with status {exitcode}"


def worker_main(config: EngineConfig, rank: int, store_port: int, channel: StepChannel, num_threads: int,
                log_level: int) -> None:
    """Entry point of rank `rank` (>= 1): join the group, build this rank's shard, run steps until told to stop."""
    from kubeinfer.runtime.engine import sleep as engine_sleep
    from kubeinfer.runtime.engine.model_runner import ModelRunner

    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s tp-rank{rank} %(name)s: %(message)s")
    parent = mp.parent_process()
    threading.Thread(target=_exit_with_parent, args=(parent,), name="kubeinfer-tp-parent", daemon=True).start()
    torch.set_num_threads(num_threads)
    # Ctrl-C, and SIGTERM from launchers that signal the whole process group, are rank 0's to handle: it drains,
    # then stops the workers; a worker outlives rank 0 by at most a moment (see _exit_with_parent).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    try:
        store = dist.TCPStore("127.0.0.1", store_port, config.world_size, is_master=False,
                              timeout=TIMEOUT)
        _init_process_group(config, rank, store)
        runner = ModelRunner(config, rank)
        sleeping = None
        while (message := channel.receive(rank)) is not None:
            if not isinstance(message, dict):
                runner.execute(unpack(message))
            elif "sleep" in message:
                sleeping = engine_sleep.sleep_at(runner, sleeping, message["sleep"])
            elif sleeping is not None:   # {"wake": True}
                engine_sleep.wake(runner, sleeping)
                sleeping = None
    except Exception:
        logger.exception("tensor-parallel rank %d failed", rank)
        raise SystemExit(EXIT_STATUS)
    finally:
        channel.close(unlink=False)
    dist.destroy_process_group()


def _exit_with_parent(parent) -> None:
    parent.join()
    logging.getLogger(__name__).error("rank 0 (pid %d) is gone; this worker exits", parent.pid)
    os._exit(EXIT_STATUS)
