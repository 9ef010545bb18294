"""`kubeinfer serve`: starts the engine (its own process), then the HTTP server; drains on SIGTERM.

Drain: the first SIGTERM (or SIGINT) turns `/ready` to 503 and refuses new requests with 503, lets the
requests in flight finish for up to `--drain-timeout-seconds`, then stops the server; the process exits 0.
A second signal stops at once. A signal before the server listens stops start-up (`StartupSignals`).
"""
import asyncio
import gc
import logging
import signal
import threading
import time

import uvicorn

from kubeinfer.runtime.compile_cache import ensure_writable_caches
from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.disagg.source_signature import read_key
from kubeinfer.runtime.server.app import create_app
from kubeinfer.runtime.server.auth import ANONYMOUS, KeyRing, load_api_keys
from kubeinfer.runtime.server.engine_client import EngineClient
from kubeinfer.runtime.server.lora_file import LoraFile
from kubeinfer.runtime.server.trusted_header import TrustedTenantHeader
from kubeinfer.runtime.server.metrics import EngineMetrics
from kubeinfer.runtime.server.admission import ServerState
from kubeinfer.runtime.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
# Idle keep-alive connections stay open longer than the usual load balancer's idle timeout (60 s): a server
# that closes first races the client's next request on that connection (seen: a ReadError in a benchmark
# client with uvicorn's default of 5 s).
KEEP_ALIVE_SECONDS = 65
# uvicorn's event loop and HTTP parser, as measured (docs/benchmarks/cpu-runtime.md, "Serving through HTTP: engine
# thread vs engine process"), not its pick ("auto" takes uvloop and
# httptools, which the router brings): uvloop starved the engine-on-a-thread mode. The tests' servers use it too.
HTTP_STACK = {"loop": "asyncio", "http": "h11"}


class StopRequested(Exception):
    """SIGTERM or SIGINT while the model loads."""


class StartupSignals:
    """SIGTERM/SIGINT before uvicorn's own handlers exist. Without a handler, a container's PID 1 ignores
    them: a pod deleted while its model loaded went on loading, then served, until the SIGKILL at the end of
    its grace period (130 s seen on the real cluster). While the engine starts, a signal raises StopRequested
    (the engine process is killed, the server exits 0 without serving); after that and until the server
    listens, it is remembered, and the server drains at once when it listens."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.pending: list[int] = []
        self.active = threading.current_thread() is threading.main_thread()   # handlers: main thread only

    def __enter__(self) -> "StartupSignals":
        self._set(self._raise)
        return self

    def __exit__(self, *exc) -> None:
        self._set(self._remember)

    def _set(self, handler) -> None:
        if self.active:
            for sig in self.SIGNALS:
                signal.signal(sig, handler)

    def _raise(self, signum, frame) -> None:
        raise StopRequested(signal.Signals(signum).name)

    def _remember(self, signum, frame) -> None:
        self.pending.append(signum)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        self.on_listening()

    def on_listening(self) -> None:
        """Called once the socket listens (set by `serve`)."""

    def handle_exit(self, sig, frame) -> None:
        if self.state.draining or self._loop is None:
            return super().handle_exit(sig, frame)
        self.state.draining = True
        logger.info("draining: %d requests in flight, up to %.0f s", self.state.engine.num_in_flight,
                    self.drain_timeout)
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.state.engine.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.state.engine.num_in_flight:
            logger.warning("drain timeout: %d requests still in flight are cut off", self.state.engine.num_in_flight)
        else:
            logger.info("drained")
        self.should_exit = True


def build_state(config: EngineConfig, api_keys_file: str | None = None,
                default_tokens_per_minute: int | None = None, engine_mode: str = "process",
                log_level: str = "INFO", vllm_metrics: bool = True) -> ServerState:
    """Everything the app serves from; the engine is started (the model loaded) before this returns.

    API keys are read first, so a bad key file fails before the model loads."""
    keys = KeyRing(load_api_keys(api_keys_file), default_tokens_per_minute)
    trusted_header = TrustedTenantHeader(config.trusted_tenant_header, config.trusted_tenant_networks)
    kv_source_key = read_key(config.kv_source_key_file)
    if config.trusted_tenant_header:
        logger.info("tenants: the %s header names the tenant of requests from %s", config.trusted_tenant_header,
                    ", ".join(config.trusted_tenant_networks))
    if keys.enabled:
        logger.info("API keys: %d configured; requests need 'Authorization: Bearer <key>'", len(keys.keys))
    tokenizer = Tokenizer(config.model)
    metrics = EngineMetrics(config.served_model_name, vllm_metrics, config.max_loras)
    metrics.add_tenants(sorted({entry.tenant.name for entry in keys.keys.values()} | {ANONYMOUS.name}))
    engine = EngineClient(config, tokenizer, metrics, engine_mode, log_level)
    info = engine.start()
    state = ServerState(engine, tokenizer, config, keys, metrics, loras=dict(info.loras or {}))
    metrics.set_adapters(state.loras)
    if config.lora_modules_file:
        state.lora_file = LoraFile(config.lora_modules_file, config.lora_modules)
    state.trusted_header, state.kv_source_key = trusted_header, kv_source_key
    return state


async def sleep_now(state: ServerState, level: int) -> None:
    figures = await state.engine.sleep(level)
    logger.info("asleep at level %d from the start: %.2f s, %.0f MiB freed", level, figures["seconds"],
                figures["freed_bytes"] / 2**20)


def serve(config: EngineConfig, host: str, port: int, api_keys_file: str | None = None,
          default_tokens_per_minute: int | None = None, drain_timeout: float = 30.0,
          log_level: str = "info", engine_mode: str = "process", vllm_metrics: bool = True,
          started_at: float | None = None, sleep_at_start: int = 0) -> int:
    """Serves until SIGTERM; returns the exit code. `started_at`: the process's start (monotonic clock), for
    the start-up phases (`imports` is the time before this call). `sleep_at_start`: the level to sleep at once
    serving (0: none): `kubeinfer_engine_sleep_level` says when it is asleep."""
    entered = time.monotonic()
    started_at = entered if started_at is None else started_at
    ensure_writable_caches()   # before the engine process, which inherits the environment
    startup_signals = StartupSignals()
    try:
        with startup_signals:
            state = build_state(config, api_keys_file, default_tokens_per_minute, engine_mode, log_level,
                                vllm_metrics)
    except StopRequested as stop:
        logger.info("%s while starting: stopped before serving", stop)
        return 0
    phases = {"imports": entered - started_at, **state.engine.info.startup_phases}
    gc.collect()
    gc.freeze()   # start-up objects are never garbage: keep them out of the collections on the serving path
    uvicorn_config = uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level.lower(),
                                    timeout_graceful_shutdown=5, access_log=False,
                                    timeout_keep_alive=KEEP_ALIVE_SECONDS, **HTTP_STACK)
    server = DrainingServer(uvicorn_config, state, drain_timeout)

    def listening() -> None:
        phases["ready"] = time.monotonic() - started_at
        state.metrics.observe_startup(phases)
        logger.info("ready in %.2f s: %s", phases["ready"],
                    ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items() if name != "ready"))
        if startup_signals.pending:   # asked to stop before uvicorn could hear it: drain (nothing in flight)
            server.handle_exit(startup_signals.pending[0], None)
        elif sleep_at_start:
            asyncio.ensure_future(sleep_now(state, sleep_at_start))

    def engine_died() -> None:   # exit non-zero, so that Kubernetes restarts the pod
        server.should_exit = True
    server.on_listening = listening
    state.engine.on_dead = engine_died
    logger.info("serving %s on http://%s:%d/v1 (engine mode: %s)", config.served_model_name, host, port, engine_mode)
    try:
        server.run()
    finally:
        state.engine.stop()
    if state.engine.error is not None:
        logger.error("exiting: %s", state.engine.error)
        return 1
    return 0 if server.started else 1
