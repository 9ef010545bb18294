"""A stand-in for a replica's runtime, as far as LoRA goes: the endpoints of docs/lora.md on loopback.

`POST /v1/load_lora_adapter` answers 200, or 400 with an OpenAI-style error naming what is wrong (no such folder,
a rank above the runtime's maximum, a name loaded from another folder); `POST /v1/unload_lora_adapter` 200, or 404
when not loaded; `GET /v1/models` lists the base model, then each adapter with its `root` and `parent`. The
folders that "exist" are `folders` (path -> the adapter's rank): the fetcher's work, which a test sets. Every
call is kept in `calls` as (route, body). With `key` set, every route wants `Authorization: Bearer KEY` (401).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web


def _error(status: int, message: str, type_: str, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "param": None, "code": code}},
                             status=status)


@dataclasses.dataclass
class LoraRuntime:
    served_name: str = "qwen"
    max_lora_rank: int = 16
    folders: dict[str, int] = dataclasses.field(default_factory=dict)
    loaded: dict[str, str] = dataclasses.field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    key: str | None = None

    def routes(self, route: str) -> list[dict[str, Any]]:
        return [body for name, body in self.calls if name == route]

    def _authorized(self, request: web.Request) -> bool:
        return self.key is None or request.headers.get("Authorization") == f"Bearer {self.key}"

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("load", body))
        if not self._authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        name, path = body["lora_name"], body["lora_path"]
        if name in self.loaded:
            if self.loaded[name] == path:
                return web.Response(text=f"adapter {name} is already loaded")
            return _error(400, f"adapter {name} is loaded from {self.loaded[name]}, not {path}",
                          "invalid_request_error")
        if path not in self.folders:
            return _error(400, f"no such folder: {path}", "invalid_request_error")
        if self.folders[path] > self.max_lora_rank:
            return _error(400, f"adapter {name} has rank {self.folders[path]}, above --max-lora-rank "
                               f"{self.max_lora_rank}", "invalid_request_error")
        self.loaded[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("unload", body))
        if not self._authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        if self.loaded.pop(body["lora_name"], None) is None:
            return _error(404, f"The model `{body['lora_name']}` does not exist.", "invalid_request_error",
                          "model_not_found")
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")

    async def models(self, request: web.Request) -> web.Response:
        self.calls.append(("models", {}))
        if not self._authorized(request):
            return _error(401, "invalid API key", "authentication_error")
        data = [{"id": self.served_name, "object": "model", "owned_by": "kubeinfer", "root": "/models/base",
                 "parent": None}]
        data += [{"id": name, "object": "model", "owned_by": "kubeinfer", "root": path, "parent": self.served_name}
                 for name, path in self.loaded.items()]
        return web.json_response({"object": "list", "data": data})


@contextlib.asynccontextmanager
async def serve(runtimes: dict[str, LoraRuntime]) -> AsyncIterator[int]:
    """Each runtime on its loopback address (127.0.0.1, 127.0.0.2, ...), all on one free port; yields the port."""
    runners: list[web.AppRunner] = []
    port = 0
    try:
        for host, runtime in runtimes.items():
            app = web.Application()
            app.router.add_post("/v1/load_lora_adapter", runtime.load)
            app.router.add_post("/v1/unload_lora_adapter", runtime.unload)
            app.router.add_get("/v1/models", runtime.models)
            runner = web.AppRunner(app)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, port)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield port
    finally:
        for runner in runners:
            await runner.cleanup()
