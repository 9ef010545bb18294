"""The FastAPI application: OpenAI routes, health and readiness, metrics, OpenAI-shaped errors."""
import asyncio
import inspect
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.server import lora_api, lora_file, openai_api, responses_api, sleep_api
from kubeinfer.runtime.server.engine_client import ENGINE_DEAD_CODE, EngineDeadError
from kubeinfer.runtime.server.errors import APIError, error_response
from kubeinfer.runtime.server.admission import ServerState
from kubeinfer.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from kubeinfer.runtime.server.responses_protocol import ResponsesRequest

logger = logging.getLogger(__name__)


class CountErrors:
    """ASGI middleware: counts every response with status >= 400 by code, whoever produced it."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                self.state.metrics.count_error(message["status"])
            await send(message)

        return await self.app(scope, receive, counting_send)


def _validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    return f"{param or 'body'}: {first.get('msg', 'invalid value')}", param


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.attach()
        watcher = asyncio.create_task(state.lora_file.watch(state)) if state.lora_file is not None else None
        yield
        if watcher is not None:
            watcher.cancel()
        state.engine.stop()

    # FastAPI >= 0.165 would add its own HTTP and operation spans beside ours (runtime/server/request_trace.py) once
    # a tracer provider is set: one set of spans, ours, on every FastAPI version.
    own_telemetry = "telemetry" in inspect.signature(FastAPI.__init__).parameters
    app = FastAPI(title="kubeinfer", version="0.1.0", lifespan=lifespan,
                  **({"telemetry": {"tracing": False, "operation_spans": False, "metrics": False, "logs": False}}
                     if own_telemetry else {}))
    app.state.server = state
    app.add_middleware(CountErrors, state=state)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return error.response()

    @app.exception_handler(InvalidRequestError)
    async def invalid_request(request: Request, error: InvalidRequestError):
        return error_response(400, str(error), error.param)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError):
        message, param = _validation_message(error)
        return error_response(400, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        return error_response(error.status_code, str(error.detail))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, error: EngineDeadError):   # a router sends the request elsewhere
        return error_response(503, str(error), code=ENGINE_DEAD_CODE)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        logger.exception("unexpected error serving %s", request.url.path)
        return error_response(500, "internal error; see the server log")

    @app.get("/health")
    async def health():
        if not state.engine.is_alive:
            return error_response(503, "the engine is not running")
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if state.draining:
            return error_response(503, "draining")
        if not state.engine.is_alive:
            return error_response(503, "the engine is not running")
        info = state.engine.info   # the role in disaggregated serving (docs/disaggregation.md)
        kv_port = {"kv_port": int(info.kv_address.rpartition(":")[2])} if info.kv_address else {}
        return {"status": "ready", "kv_role": info.kv_role or "none", **kv_port}

    @app.get("/metrics")
    async def metrics(request: Request):
        # `?name[]=A&name[]=B` restricts to those families (prometheus_client's convention): the router asks
        # for three gauges ten times a second, and rendering every histogram each time would cost ~1 ms.
        registry = state.metrics.registry
        if names := request.query_params.getlist("name[]"):
            registry = registry.restricted_registry(names)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/lora/adapters")
    async def lora_adapters():
        """What the server serves and what it refused, without a key (as /metrics, which names the adapters too):
        the operator reads it for InferenceService status (docs/lora.md)."""
        return {"adapters": lora_file.report(state.loras, state.lora_file.failed if state.lora_file else {})}

    @app.get("/v1/models")
    async def models(request: Request):
        openai_api.authenticate(state, request)
        return {"object": "list", "data": [{
            "id": state.config.served_model_name, "object": "model", "created": int(time.time()),
            "owned_by": "kubeinfer", "max_model_len": state.engine.info.max_model_len},
            *lora_api.model_cards(state, int(time.time()))]}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: lora_api.LoadLoraRequest, request: Request):
        openai_api.authenticate(state, request)
        return Response(await lora_api.load(state, body), media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: lora_api.UnloadLoraRequest, request: Request):
        openai_api.authenticate(state, request)
        return Response(await lora_api.unload(state, body), media_type="text/plain")

    @app.post("/sleep")
    async def sleep(request: Request, level: str | None = None):
        openai_api.authenticate(state, request)
        return await sleep_api.sleep(state, level)

    @app.post("/wake_up")
    async def wake_up(request: Request):
        openai_api.authenticate(state, request)
        return await sleep_api.wake_up(state)

    @app.get("/is_sleeping")
    async def is_sleeping(request: Request):
        openai_api.authenticate(state, request)
        return sleep_api.is_sleeping(state)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await openai_api.completions(state, body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await openai_api.chat_completions(state, body, request)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        return await responses_api.create_response(state, body, request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request):
        return responses_api.get_response(state, response_id, request)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        return responses_api.delete_response(state, response_id, request)

    return app
