"""A stand-in for a replica's runtime, as far as the operator sees its adapters: `GET /lora/adapters` on loopback,
open (no key), listing what it serves and what it refused as the real server does (runtime/server/lora_file.py;
tests/runtime/server/test_lora_file.py holds the real one to the same shape).

The real runtime follows the list its fetcher writes (`--lora-modules-file`); here a test hands the list to
`follow` (what the kubelet's refresh of the ConfigMap and the fetcher's round do in a pod). The folders that
"exist" are `folders` (path -> the adapter's rank): the fetcher's work, which a test sets; a folder missing or of
a rank above `max_lora_rank` is refused with the runtime's kind of message. Every call is kept in `calls` as
(route, headers).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

from aiohttp import web


@dataclasses.dataclass
class LoraRuntime:
    max_lora_rank: int = 16
    folders: dict[str, int] = dataclasses.field(default_factory=dict)
    loaded: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)   # name -> (folder, message)
    calls: list[tuple[str, dict[str, str]]] = dataclasses.field(default_factory=list)

    def routes(self, route: str) -> list[dict[str, str]]:
        return [headers for name, headers in self.calls if name == route]

    def follow(self, desired: dict[str, str]) -> None:
        """What the runtime does when its list becomes `desired` (name -> folder): unload what left, load the rest."""
        self.loaded = {name: path for name, path in self.loaded.items() if desired.get(name) == path}
        self.failed = {}
        for name, path in desired.items():
            if name in self.loaded:
                continue
            if path not in self.folders:
                self.failed[name] = (path, f"adapter {name!r}: {path} is not a folder")
            elif self.folders[path] > self.max_lora_rank:
                self.failed[name] = (path, f"adapter {name!r} has rank {self.folders[path]}, above this server's "
                                           f"--max-lora-rank {self.max_lora_rank}")
            else:
                self.loaded[name] = path

    async def adapters(self, request: web.Request) -> web.Response:
        self.calls.append(("adapters", dict(request.headers)))
        report = [{"name": n, "path": p, "loaded": True, "message": ""} for n, p in self.loaded.items()]
        report += [{"name": n, "path": p, "loaded": False, "message": m} for n, (p, m) in self.failed.items()]
        return web.json_response({"adapters": report})


@contextlib.asynccontextmanager
async def serve(runtimes: dict[str, LoraRuntime]) -> AsyncIterator[int]:
    """Each runtime on its loopback address (127.0.0.1, 127.0.0.2, ...), all on one free port; yields the port.
    Any route but /lora/adapters answers 404 (and is recorded): the operator must call nothing else."""
    runners: list[web.AppRunner] = []
    port = 0
    try:
        for host, runtime in runtimes.items():
            async def other(request: web.Request, runtime: LoraRuntime = runtime) -> web.Response:
                runtime.calls.append((request.path, dict(request.headers)))
                return web.Response(status=404)
            app = web.Application()
            app.router.add_get("/lora/adapters", runtime.adapters)
            app.router.add_route("*", "/{tail:.*}", other)
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

