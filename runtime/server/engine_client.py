"""The API process's side of the engine: starts the core, streams each request's outputs to asyncio.

The core runs in its own process by default (`--engine-mode process`), so the model never shares the
GIL with HTTP, tokenization and detokenization; `--engine-mode thread` runs the same loop on a thread of
this process (debugging, and the before/after figure in docs/benchmarks.md). Either way the event loop
watches one descriptor: every step's message is read there, detokenized by the output processor, and put
into one asyncio.Queue per request. A stream whose consumer goes away (a client disconnect) aborts its
request, which frees its KV blocks at once.

If the engine dies, every open stream ends with an error, `/health` fails, and `on_dead` is called (the
server then exits non-zero, so Kubernetes restarts it).
"""
import asyncio
import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator, Callable

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.disagg.errors import TransferError
from kubeinfer.runtime.engine.messages import (AbortRequests, AddRemoteRequest, AddRequest, EngineFailed, EngineInfo,
                                               LoraDone, LoraOperation, PutToSleep, RequestFailed, Rejected, Shutdown,
                                               Slept, StepOutput, StepsRead, StopRequest, ToEngine, TransferFailed,
                                               WakeUp, Woke)
from kubeinfer.runtime.engine.output_processor import OutputProcessor, RequestOutput
from kubeinfer.runtime.errors import InvalidRequestError, KubeinferError
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.errors import APIError
from kubeinfer.runtime.server.engine_start import spawn_core_process, start_core_thread, join_core, wait_until_ready
from kubeinfer.runtime.server.metrics import EngineMetrics
from kubeinfer.runtime.server.protocol import Resume
from kubeinfer.runtime.tokenizer import Tokenizer, eos_token_ids

logger = logging.getLogger(__name__)
ENGINE_MODES = ("process", "thread")


ENGINE_DEAD_CODE = "engine_dead"   # the error code of a 503 answered because of it


class EngineDeadError(RuntimeError):
    """The engine failed; no request can be served any more."""


class EngineClient:
    def __init__(self, config: EngineConfig, tokenizer: Tokenizer, metrics: EngineMetrics, mode: str = "process",
                 log_level: str = "INFO"):
        if mode not in ENGINE_MODES:
            raise KubeinferError(f"engine mode must be one of {', '.join(ENGINE_MODES)}, got {mode!r}")
        self.config, self.metrics, self.mode, self.log_level = config, metrics, mode, log_level
        self.processor = OutputProcessor(tokenizer)
        self.info: EngineInfo | None = None
        self.error: EngineDeadError | None = None
        self.on_dead: Callable[[], None] | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._replies: dict[int, asyncio.Future] = {}   # answers to control messages awaited, by message number
        self._numbers = itertools.count(1)
        self.sleep_level = 0   # 0 awake; else the level the engine sleeps at (engine/sleep.py)
        self._channel = None
        self._process: multiprocessing.Process | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def is_alive(self) -> bool:
        if self.error is not None or self.info is None:
            return False
        worker = self._process if self._process is not None else self._thread
        return worker is not None and worker.is_alive()

    # -- life cycle ----------------------------------------------------------------------------------------------
    def start(self) -> EngineInfo:
        """Starts the core and waits until it has loaded the model (blocking; before the event loop runs). A
        start that fails or is interrupted (SIGTERM while loading) leaves no engine process behind."""
        try:
            return self._start()
        except BaseException:
            join_core(self._process, timeout=0)   # it ignores SIGTERM, and is not reading its channel while it loads
            raise

    def _start(self) -> EngineInfo:
        eos = eos_token_ids(self.config.model_config.eos_token_ids, self.processor.tokenizer)
        if self.mode == "process":
            self._channel = spawn_core_process(self.config, eos, self.log_level,
                                               lambda process: setattr(self, "_process", process))
        else:
            self._thread, self._channel = start_core_thread(self.config, eos)
        self.info = wait_until_ready(self._channel, self._process or self._thread, self.mode,
                                     lambda: join_core(self._process or self._thread, timeout=10))
        self.metrics.observe_engine(self.info.block_size, self.info.num_blocks, self.info.speculative_tokens,
                                    self.info.num_gpus)
        self.metrics.kv.set_role(self.info.kv_role, self.info.kv_address)
        return self.info

    def attach(self) -> None:
        """Starts watching the engine from the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._channel.watch(self._loop, self._on_readable)
        if self._process is not None:
            self._loop.add_reader(self._process.sentinel, self._on_process_exit)

    def stop(self) -> None:
        """Stops the core (and its tensor-parallel workers). Idempotent."""
        self._unwatch()
        if self._channel is not None:
            try:
                self._channel.send(Shutdown())
            except (OSError, ValueError):
                pass
        join_core(self._process or self._thread, timeout=15)

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        for fd in (self._channel.fileno(), getattr(self._process, "sentinel", None)):
            if fd is not None:
                loop.remove_reader(fd)

    # -- requests ------------------------------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       resumed: Resume | None = None, kv_source: str | None = None) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine makes them. `resumed`: the output its client already has from a
        replica that died (the first output here carries only what follows it). `kv_source`: the prefill replica's
        KV endpoint its prompt's KV and first token are pulled from (a decode replica); a failed pull raises
        `TransferError`."""
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running: {self.error or 'not started'}")
        arrival = time.monotonic()
        if self.sleep_level:
            self.metrics.sleep.waited.inc()   # its add wakes the engine first
        resumed_ids = resumed.token_ids if resumed else []
        self.processor.add(request_id, prompt_token_ids, params, arrival, resumed_ids,
                           resumed.text_chars if resumed else 0)
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        if kv_source is None:
            self._send(AddRequest(request_id, prompt_token_ids, params, arrival, resumed_ids))
        else:
            self._send(AddRemoteRequest(request_id, prompt_token_ids, params, arrival, kv_source))
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._abort(request_id)

    async def _ask(self, kind: type[LoraOperation | PutToSleep | WakeUp], *args) -> LoraDone | Slept | Woke:
        """Sends the control message kind(number, *args) and awaits the engine's answer to that number."""
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running: {self.error or 'not started'}")
        number = next(self._numbers)
        reply = self._replies[number] = asyncio.get_running_loop().create_future()
        self._send(kind(number, *args))
        try:
            return await reply
        finally:
            self._replies.pop(number, None)

    async def lora(self, operation: str, name: str, path: str | None) -> None:
        """Loads ("load", name, folder) or unloads ("unload", name) an adapter; InvalidRequestError: what is wrong."""
        done = await self._ask(LoraOperation, operation, name, path)
        if done.error is not None:
            raise InvalidRequestError(done.error, "lora_path")

    async def sleep(self, level: int) -> dict:
        """Puts the engine to sleep once its requests have finished (engine/sleep.py): its level, seconds, bytes freed."""
        slept = await self._ask(PutToSleep, level)
        if slept.error is not None:
            raise InvalidRequestError(slept.error, "level")
        return slept.figures

    async def wake_up(self) -> dict:
        """Wakes the engine (a no-op when awake); the level it woke from, the seconds it took."""
        return (await self._ask(WakeUp)).figures

    def _abort(self, request_id: str) -> None:
        output = self.processor.abort(request_id)
        if output is not None:
            self.metrics.record_output(output, time.monotonic())
        self._send(AbortRequests([request_id]))

    def _send(self, message: ToEngine) -> None:
        if self.error is None:
            try:
                self._channel.send(message)
            except (OSError, ValueError, EOFError) as error:
                self._die(f"the engine's channel broke: {error}")

    # -- messages from the core -------------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            messages = self._channel.receive()
        except (EOFError, ConnectionError):   # closed or reset by the engine's end: its process ended
            self._die(self._exit_reason())
            return
        except OSError as error:   # anything else is this end's own failure, not an exit
            self._die(f"reading the engine's channel failed: {error!r}")
            return
        steps = 0
        for message in messages:
            match message:
                case StepOutput():
                    steps += 1
                    self._on_step(message)
                case Rejected():
                    self.processor.abort(message.request_id)
                    self._deliver(message.request_id, InvalidRequestError(message.message))
                case TransferFailed() | RequestFailed():
                    self._on_failed(message)
                case LoraDone():
                    self._answer(message.number, message)
                case Slept():
                    if message.figures is not None:
                        self.metrics.sleep.slept(self.sleep_level, message.figures["level"])
                        self.sleep_level = message.figures["level"]
                    self._answer(message.number, message)
                case Woke():
                    self.sleep_level = 0
                    self.metrics.sleep.woke("request" if message.number is None else "api", message.figures)
                    self._answer(message.number, message)
                case EngineFailed():
                    self._die(message.message)
                case _:
                    self._die(f"the engine sent a message this side does not know: {message!r}")
        if steps:
            self._send(StepsRead(steps))   # lets the core run ahead again (core_loop.MAX_STEPS_AHEAD)

    def _answer(self, number: int | None, answer: LoraDone | Slept | Woke) -> None:
        reply = self._replies.get(number)
        if reply is not None and not reply.done():
            reply.set_result(answer)

    def _on_step(self, step: StepOutput) -> None:
        outputs, stopped = self.processor.process(step.deltas)
        for request_id, stop in stopped:
            self._send(StopRequest(request_id, stop))
        now = time.monotonic()
        for output in outputs:
            self.metrics.record_output(output, now)
            self._deliver(output.request_id, output)
        self.metrics.observe_stats(step.stats, step.seconds, step.tenant_tokens)

    def _on_failed(self, message: TransferFailed | RequestFailed) -> None:
        """The engine ended a request, saying why: a failed KV pull (502), or an adapter it could not read (500)."""
        output = self.processor.abort(message.request_id)
        if output is not None:
            output.finish_reason, output.error = "error", message.message
            self.metrics.record_output(output, time.monotonic())
        self._deliver(message.request_id, TransferError(message.message) if isinstance(message, TransferFailed)
                      else APIError(500, message.message, code="request_failed"))

    def _on_process_exit(self) -> None:
        self._loop.remove_reader(self._process.sentinel)
        self._on_readable()   # an error message it sent before exiting
        if self.error is not None:
            return
        self._die(self._exit_reason())

    def _exit_reason(self) -> str:
        if self._process is None:
            return "the engine thread ended"
        self._process.join(2)   # the channel closes a moment before the exit code is known
        return f"the engine process exited (exit code {self._process.exitcode})"

    def _die(self, reason: str) -> None:
        if self.error is not None:
            return
        self.error = EngineDeadError(reason)
        logger.error("the engine is dead: %s; failing %d requests in flight", reason, len(self._streams))
        self._unwatch()
        for request_id in list(self._streams):
            self._deliver(request_id, EngineDeadError(f"the engine failed: {reason}"))
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(EngineDeadError(f"the engine failed: {reason}"))
        if self.on_dead is not None:
            self.on_dead()

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(item)
