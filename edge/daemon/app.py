"""The daemon's HTTP API (FastAPI): thin handlers over the GenerationPool.

  POST /v1/completions        text completion (one choice per prompt), `stream: true` as SSE
  POST /v1/chat/completions   chat completion (the tokenizer's chat template, see chat_template.py)
  GET  /v1/models[/{id}]      the one advertised model, with its context length (max_model_len)
  POST /tokenize, /detokenize text <-> token ids with the daemon's tokenizer (vLLM's shapes)
  GET  /health                readiness: 200 while requests can be served, else 503 (JSON)
  GET  /healthz               liveness + pool and link state (JSON)
  GET  /version               the Tandem version
  GET  /metrics               Prometheus text format

Every error leaves as OpenAI's body `{"error": {"message", "type", "param", "code"}}`:
FastAPI's 422 validation errors become 400, unknown routes 404, 503s carry Retry-After, and the
daemon keeps serving. Middleware (outermost first): access log + request metrics, CORS
(daemon.cors_origins), API key (daemon.api_key), body limit (daemon.max_body_bytes, counted
while the body is read, so a huge body is refused without being held in memory).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Sequence
from functools import partial

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.config import DaemonConfig
from edge.daemon.pool import GenerationPool
from edge.daemon.errors import (ApiError, BadRequest, BodyTooLarge, MethodNotAllowed,
                                RouteNotFound, Unauthorized, from_validation_errors)
from edge.daemon.metrics import DaemonMetrics
from edge.daemon.output import GenerationOutput
from edge.daemon.openai_schema import (ChatCompletionRequest, ChatMessageIn, CompletionRequest,
                                       OpenAIRequest, surrogate_path)
from edge.daemon.responses import (chat_events, chat_response, completion_events,
                                   completion_response, verification_headers,
                                   VERIFIED_FRACTION_HEADER, UNVERIFIED_TOKENS_HEADER)
from tandem.cli import version

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
OPEN_PATHS = ("/health", "/healthz", "/version", "/metrics")  # answered without the API key

log = logging.getLogger("edge.daemon")
access_log = logging.getLogger("edge.daemon.access")


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


def create_app(pool: GenerationPool) -> FastAPI:
    """The daemon's HTTP app: its middleware, its errors as OpenAI-shaped bodies, its routes."""
    app = FastAPI(title="Tandem edge daemon", docs_url=None, redoc_url=None, openapi_url=None)
    _add_middleware(app, pool)
    _add_error_handlers(app, pool.config.max_body_bytes)
    for router in (status_routes(pool), token_routes(pool), generation_routes(pool)):
        app.include_router(router)
    return app


def _add_middleware(app: FastAPI, pool: GenerationPool) -> None:
    config = pool.config
    # add_middleware puts each one outside the ones before it.
    app.add_middleware(_BodyLimit, limit=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(_ApiKey, key=config.api_key)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                           expose_headers=[VERIFIED_FRACTION_HEADER, UNVERIFIED_TOKENS_HEADER],
                           allow_credentials="*" not in config.cors_origins)
    app.add_middleware(_AccessLog, metrics=pool.metrics)


def _add_error_handlers(app: FastAPI, max_body_bytes: int) -> None:
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
        if isinstance(exc.__cause__, _TooLarge):  # FastAPI wraps errors while reading the body
            return error_response(BodyTooLarge(f"the request body is larger than this daemon "
                                               f"accepts ({max_body_bytes} bytes; "
                                               "daemon.max_body_bytes)"))
        error = ApiError(str(exc.detail))
        error.status = exc.status_code
        return error_response(error)


def check_fields(config: DaemonConfig, req: OpenAIRequest, endpoint: str) -> None:
    """Unknown fields: a logged warning, or a 400 in strict mode (daemon.strict_openai)."""
    unknown = list(req.unknown_fields)
    if isinstance(req, CompletionRequest) and req.suffix:
        unknown.append("suffix")  # no fill-in-the-middle: the suffix cannot be honoured
    if not unknown:
        return
    if config.strict_openai:
        raise BadRequest(f"Unrecognized request argument supplied: {unknown[0]}",
                         param=unknown[0])
    log.warning("%s: ignoring request fields this daemon does not support: %s", endpoint,
                ", ".join(unknown))


def status_routes(pool: GenerationPool) -> APIRouter:
    """Health, version, metrics and the model list: answered without generating anything."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        body = pool.health()
        ready = body.get("status") == "ok"
        return JSONResponse(body, status_code=200 if ready else 503,
                            headers=None if ready else {"Retry-After": "1"})

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(pool.health())

    @router.get("/version")
    async def version_() -> JSONResponse:
        return JSONResponse({"version": version()})

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(pool.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(pool.jobs.models().model_dump())

    @router.get("/v1/models/{model_id}")
    async def model(model_id: str) -> JSONResponse:
        pool.jobs.check_model(model_id)
        return JSONResponse(pool.jobs.model_card().model_dump())

    return router


def token_routes(pool: GenerationPool) -> APIRouter:
    """vLLM's /tokenize and /detokenize, with the daemon's own tokenizer and chat template."""
    router = APIRouter()
    config = pool.config

    @router.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> JSONResponse:
        if req.model is not None:
            pool.jobs.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise BadRequest("send either `prompt` or `messages`", param="prompt")
        if surrogate_path(req.prompt) is not None:
            raise BadRequest("prompt holds a lone UTF-16 surrogate", param="prompt")
        if req.messages is not None:
            try:
                chat = ChatCompletionRequest(model=config.model_name, messages=req.messages,
                                             add_generation_prompt=req.add_generation_prompt)
            except ValidationError as exc:  # e.g. an empty list: a 400, as for chat requests
                raise BadRequest(f"messages: {exc.errors()[0]['msg']}",
                                     param="messages") from exc
            ids = list((await run_in_threadpool(pool.jobs.chat_job, chat)).request.prompt_ids)
        else:
            ids = await run_in_threadpool(pool.tokenizer.encode, req.prompt)
        return JSONResponse({"count": len(ids), "max_model_len": pool.jobs.context_limit,
                             "tokens": ids})

    @router.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> JSONResponse:
        if req.model is not None:
            pool.jobs.check_model(req.model)
        vocab = pool.tokenizer.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise BadRequest(f"token id {bad} outside the vocabulary [0, {vocab})",
                                 param="tokens")
        text = await run_in_threadpool(pool.tokenizer.decode, req.tokens)
        return JSONResponse({"prompt": text})

    return router


def generation_routes(pool: GenerationPool) -> APIRouter:
    """The OpenAI completions and chat completions, streamed or whole."""
    router = APIRouter()
    config = pool.config

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        arrived = time.monotonic()  # the origin of queue_s and TTFT
        check_fields(config, req, "/v1/completions")
        pool.jobs.check_model(req.model)
        # Tokenizing can take a while for long prompts: off the event loop.
        jobs = [await run_in_threadpool(pool.jobs.completion_job, req, prompt)
                for prompt in req.prompts]
        echoes = [text if req.echo else "" for _, text in jobs]
        if req.stream:
            # Admitted now: an overload is still a 503. The later prompts run one after
            # another, each arriving when the one before it ends.
            first = pool.stream(jobs[0][0], arrived)
            streams = [lambda: first] + [partial(pool.stream, job) for job, _ in jobs[1:]]
            events = completion_events(streams, req.model, req.include_usage_chunk, echoes,
                                       on_done=partial(_note_outputs, request),
                                       continuous_usage=req.continuous_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        outs = await asyncio.gather(*(pool.complete(job, arrived) for job, _ in jobs))
        _note_outputs(request, outs)
        return JSONResponse(completion_response(outs, req.model, echoes,
                                                req.return_token_ids).model_dump(),
                            headers=verification_headers(outs))

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        arrived = time.monotonic()  # the origin of queue_s and TTFT
        check_fields(config, req, "/v1/chat/completions")
        pool.jobs.check_model(req.model)
        job = await run_in_threadpool(pool.jobs.chat_job, req)
        if req.stream:
            events = chat_events(pool.stream(job, arrived), req.model, req.include_usage_chunk,
                                 on_done=partial(_note_outputs, request),
                                 continuous_usage=req.continuous_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        out = await pool.complete(job, arrived)
        _note_outputs(request, [out])
        return JSONResponse(chat_response(out, req.model).model_dump(),
                            headers=verification_headers([out]))

    return router


def _note_outputs(request: Request, outs: Sequence[GenerationOutput]) -> None:
    """For the access log: this request's completion tokens, and its longest wait for a pool
    slot (queue_s) over its generations."""
    state = request.scope.setdefault("state", {})
    state["completion_tokens"] = sum(out.completion_tokens for out in outs)
    if outs:
        state["queue_s"] = max(out.stats.queue_s for out in outs)


def error_response(exc: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return JSONResponse(exc.body().model_dump(), status_code=exc.status, headers=headers)


async def _send_error(send: Send, exc: ApiError) -> None:
    response = error_response(exc)
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


class _AccessLog:
    """One access line per request (method, path, status, completion tokens, seconds, and the
    time it waited for a pool slot) and the request metrics by route and status (pure ASGI,
    so streaming responses pass through)."""

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
            elapsed = time.monotonic() - start
            route = scope.get("route")
            endpoint = getattr(route, "path", "unmatched")
            generation = endpoint.startswith("/v1/") and scope.get("method") == "POST"
            self.metrics.observe_request(endpoint, status, elapsed if generation else None)
            state = scope.get("state", {})
            tokens, queue_s = state.get("completion_tokens"), state.get("queue_s")
            client = scope.get("client") or ("-", 0)
            access_log.info('%s "%s %s" %d%s %.3fs%s', client[0], scope.get("method"),
                            scope.get("path"), status,
                            f" {tokens} tokens" if tokens is not None else "", elapsed,
                            f" (queued {queue_s:.3f}s)" if queue_s is not None else "")


class _ApiKey:
    """Requires daemon.api_key as `Authorization: Bearer KEY` or `x-api-key: KEY` on every
    path but the health, version and metrics ones (and CORS preflights)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" \
                or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        given = headers.get(b"x-api-key", b"")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if not hmac.compare_digest(given, self.key):
            await _send_error(send, Unauthorized(
                "Incorrect API key provided: send the daemon's key as 'Authorization: Bearer "
                "KEY' (the OpenAI clients' api_key) or 'x-api-key: KEY'"))
            return
        await self.app(scope, receive, send)


class _BodyLimit:
    """Refuses a body larger than `limit` bytes (413): at once from Content-Length, or as
    soon as the bytes read so far pass the limit, so a huge body is never held in memory."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > self.limit:
            await _send_error(send, self._error())
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge
            return message

        async def noting(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, noting)
        except _TooLarge:
            if not started:
                await _send_error(send, self._error())

    def _error(self) -> BodyTooLarge:
        return BodyTooLarge(f"the request body is larger than this daemon accepts "
                            f"({self.limit} bytes; daemon.max_body_bytes)")


class _TooLarge(Exception):
    pass
