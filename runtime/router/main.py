"""`kubeinfer router`: serves the router with uvicorn until SIGTERM.

On SIGTERM uvicorn stops accepting connections and lets open requests (streams included) finish for up to
`drain_timeout` seconds, as a replica drains; the replicas themselves are not touched. Then the process exits 0
(a second SIGINT forces the exit).

uvicorn runs on uvloop with the httptools parser: with asyncio's own loop and h11 the router added 1.2-1.4 ms
to a request's time to first token on this project's 2-core box, with these 0.4-0.6 ms (docs/router.md).
(`kubeinfer serve` keeps asyncio and h11, measured there; uvloop hurt its engine-on-a-thread mode.)
"""
import importlib.util
import logging
import signal

import uvicorn

from kubeinfer.runtime.router.app import Router
from kubeinfer.runtime.router.settings import RouterSettings

logger = logging.getLogger(__name__)
KEEP_ALIVE_SECONDS = 65   # longer than the usual client/load-balancer idle timeout (as `kubeinfer serve`)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, less its re-raising of the signal after a graceful shutdown (uvicorn >= 0.29), which
    made a drained router end "killed by SIGTERM" (exit code 143 in its pod) rather than 0."""

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def serve(settings: RouterSettings, host: str, port: int, log_level: str = "info", drain_timeout: float = 30.0) -> int:
    router = Router(settings)
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"   # uvloop has no Windows build
    config = uvicorn.Config(router, host=host, port=port, log_level=log_level.lower(), access_log=False,
                            loop=loop, http="httptools",
                            lifespan="on", timeout_keep_alive=KEEP_ALIVE_SECONDS,
                            timeout_graceful_shutdown=drain_timeout,
                            server_header=False, date_header=False)   # the replica's own are relayed
    server = GracefulServer(config)
    replicas = (f"the ready endpoints of service {settings.namespace}/{settings.service}" if settings.service
                else f"the replicas listed in {settings.endpoints_file}" if settings.endpoints_file
                else f"{len(settings.upstreams)} replicas")
    logger.info("routing to %s (%s policy) on http://%s:%d/v1", replicas, settings.policy, host, port)
    server.run()
    return 0 if server.started else 1
