"""A stand-in Prometheus for the operator's tests: one async handler served at /api/v1/query on loopback."""
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def serve_query_endpoint(handle: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """Serves `handle` at GET /api/v1/query on a free loopback port; yields the base URL."""
    app = web.Application()
    app.router.add_get("/api/v1/query", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
