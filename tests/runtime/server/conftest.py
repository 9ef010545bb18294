"""A real server on 127.0.0.1: uvicorn on a thread, our app, the engine on its own thread."""
import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.server.app import create_app
from kubeinfer.runtime.server.main import build_state

MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model_dir: Path, api_keys_file: str | None = None, default_tokens_per_minute: int | None = None,
                   **engine_settings):
    config = EngineConfig(model=str(model_dir), served_model_name=MODEL, **engine_settings)
    state = build_state(config, api_keys_file, default_tokens_per_minute)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="module")
def server(llama_dir):
    with running_server(llama_dir, max_model_len=256) as running:
        yield running


@pytest.fixture
def start_server():
    """`running_server` itself, for tests that need a server with their own settings."""
    return running_server
