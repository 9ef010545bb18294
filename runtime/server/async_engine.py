"""Runs the engine's step loop on its own thread and streams each request's outputs to asyncio.

The event loop never waits on the model: requests and aborts go to the engine thread through a queue;
outputs come back through `loop.call_soon_threadsafe` into one asyncio.Queue per request. A stream
whose consumer goes away (a client disconnect) aborts its request, which frees its KV blocks at once.
"""
import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator

from kubeinfer.runtime.engine.llm_engine import LLMEngine, RequestOutput
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.metrics import EngineMetrics

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread failed; no request can be served any more."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: EngineMetrics):
        self.engine = engine
        self.metrics = metrics
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the engine thread, then the engine (and its tensor-parallel workers)."""
        self._stopping.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.engine.shutdown()

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running: {self.error!r}")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        self._commands.put(("add", request_id, prompt_token_ids, params, time.monotonic()))
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", request_id))

    # -- the engine thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping.is_set():
                self._drain_commands(block=not engine.has_unfinished_requests())
                if engine.has_unfinished_requests():
                    started = time.perf_counter()
                    outputs = engine.step()
                    self.metrics.observe_step(engine, outputs, time.perf_counter() - started)
                    for output in outputs:
                        self._deliver(output.request_id, output)
        except BaseException as error:   # the engine is broken: fail every stream, refuse new requests
            logger.exception("engine step failed; the server can no longer serve requests")
            self.error = error
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDeadError(f"the engine failed: {error!r}"))

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt_token_ids, params, arrival = command
            if request_id not in self._streams:   # already gone: the client left before admission
                return
            try:
                self.engine.add_request(request_id, prompt_token_ids, params, arrival)
            except Exception as error:
                self._deliver(request_id, error)
        elif kind == "abort":
            output = self.engine.abort_request(command[1])
            if output is not None:
                self.metrics.record_output(output, time.monotonic())
                self.metrics.observe_step(self.engine, [], None)   # the gauges, even if no step follows

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            self._loop.call_soon_threadsafe(stream.put_nowait, item)
