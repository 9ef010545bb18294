"""A real server on 127.0.0.1: uvicorn on a thread, our app, the engine in its own process."""
import contextlib
import threading
from pathlib import Path

import pytest
import uvicorn

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.server.app import create_app
from kubeinfer.runtime.server.main import HTTP_STACK, build_state
from support import free_port, wait_for

MODEL = "tiny"


@contextlib.contextmanager
def running_server(model_dir: Path, api_keys_file: str | None = None, default_tokens_per_minute: int | None = None,
                   engine_mode: str = "process", **engine_settings):
    config = EngineConfig(model=str(model_dir), served_model_name=MODEL, **engine_settings)
    state = build_state(config, api_keys_file, default_tokens_per_minute, engine_mode)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning",
                                                 **HTTP_STACK))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 30, "the server to start", 0.02)
    assert server.started, "the server thread ended before it started serving"
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        state.engine.stop()


@pytest.fixture(scope="module")
def server(llama_dir):
    with running_server(llama_dir, max_model_len=256) as running:
        yield running


@pytest.fixture(scope="session")
def start_server():
    """`running_server` itself, for tests that need a server with their own settings."""
    return running_server
