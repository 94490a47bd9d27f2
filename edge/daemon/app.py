"""The daemon's HTTP API (FastAPI): thin handlers over the Engine.

  POST /v1/completions        text completion, `stream: true` as server-sent events
  POST /v1/chat/completions   chat completion (the engine's documented plain template)
  GET  /v1/models[/{id}]      the one advertised model
  GET  /healthz               liveness + pool and link state (JSON)
  GET  /metrics               Prometheus text format

Every error leaves as OpenAI's body `{"error": {"message", "type", "param", "code"}}`:
FastAPI's 422 validation errors become 400, unknown routes 404, and the daemon keeps serving.
"""
from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.daemon.engine import Engine
from edge.daemon.errors import ApiError, MethodNotAllowed, RouteNotFound, from_validation_errors
from edge.daemon.metrics import DaemonMetrics
from edge.daemon.openai_schema import ChatCompletionRequest, CompletionRequest
from edge.daemon.responses import chat_events, chat_response, completion_events, completion_response

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="Tandem edge daemon", docs_url=None, redoc_url=None)
    app.add_middleware(_RequestMetrics, metrics=engine.metrics)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(from_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return error_response(RouteNotFound(f"Unknown request URL: {where}"))
        if exc.status_code == 405:
            return error_response(MethodNotAllowed(f"Method not allowed: {where}"))
        error = ApiError(str(exc.detail))
        error.status = exc.status_code
        return error_response(error)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(engine.health())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(engine.models().model_dump())

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> JSONResponse:
        engine.check_model(model_id)
        return JSONResponse(engine.model_card().model_dump())

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        job, prompt_text = engine.completion_job(req)
        echo = prompt_text if req.echo else ""
        if req.stream:
            events = completion_events(engine.stream(job), req.model, req.include_usage_chunk, echo)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        out = await engine.complete(job)
        return JSONResponse(completion_response(out, req.model, echo).model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest) -> Response:
        job = engine.chat_job(req)
        if req.stream:
            events = chat_events(engine.stream(job), req.model, req.include_usage_chunk)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        out = await engine.complete(job)
        return JSONResponse(chat_response(out, req.model).model_dump())

    return app


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body().model_dump(), status_code=exc.status)


class _RequestMetrics:
    """Counts requests by route and status and times them (pure ASGI, so streaming responses
    pass through untouched)."""

    def __init__(self, app: ASGIApp, metrics: DaemonMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.monotonic()

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", "unmatched")
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            if endpoint.startswith("/v1/") and scope.get("method") == "POST":
                self.metrics.request_seconds.labels(endpoint=endpoint).observe(time.monotonic() - start)
