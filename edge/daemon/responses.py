"""Engine output -> OpenAI response bodies and SSE chunk streams (pure functions and small async
generators; the handlers in app.py only pick one)."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from edge.daemon import sse
from edge.daemon.engine import GenerationOutput, TextStream
from edge.daemon.errors import ApiError
from edge.daemon.openai_schema import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
    Usage,
)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(out: GenerationOutput) -> Usage:
    return Usage(prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                 total_tokens=out.prompt_tokens + out.completion_tokens)


def completion_response(out: GenerationOutput, model: str, echo_text: str = "") -> CompletionResponse:
    return CompletionResponse(
        id=new_id("cmpl"), created=int(time.time()), model=model,
        choices=[CompletionChoice(text=echo_text + out.text, finish_reason=out.finish_reason)],
        usage=usage(out), tandem=out.stats)


def chat_response(out: GenerationOutput, model: str) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=new_id("chatcmpl"), created=int(time.time()), model=model,
        choices=[ChatChoice(message=ChatMessageOut(content=out.text), finish_reason=out.finish_reason)],
        usage=usage(out), tandem=out.stats)


async def completion_events(stream: TextStream, model: str, include_usage: bool,
                            echo_text: str = "") -> AsyncIterator[bytes]:
    """SSE chunks of /v1/completions: text deltas, then a chunk with finish_reason and the
    `tandem` stats, then (stream_options.include_usage) a usage chunk with no choices."""
    cid, created = new_id("cmpl"), int(time.time())

    def chunk(choices: list[CompletionChoice], **extra) -> bytes:
        return sse.event(CompletionResponse(id=cid, created=created, model=model, choices=choices, **extra))

    def text(piece: str, finish_reason: str | None = None) -> list[CompletionChoice]:
        return [CompletionChoice(text=piece, finish_reason=finish_reason)]

    if echo_text:
        yield chunk(text(echo_text))
    async for item in _guarded(stream):
        if isinstance(item, ApiError):
            yield sse.event(item.body())
            break
        if isinstance(item, str):
            yield chunk(text(item))
            continue
        yield chunk(text("", item.finish_reason), tandem=item.stats)
        if include_usage:
            yield chunk([], usage=usage(item))
    yield sse.DONE


async def chat_events(stream: TextStream, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE chunks of /v1/chat/completions: a role chunk, content deltas, a chunk with
    finish_reason and the `tandem` stats, then (include_usage) a usage chunk with no choices."""
    cid, created = new_id("chatcmpl"), int(time.time())

    def chunk(choices: list[ChatChunkChoice], **extra) -> bytes:
        return sse.event(ChatCompletionChunk(id=cid, created=created, model=model, choices=choices, **extra))

    yield chunk([ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])
    async for item in _guarded(stream):
        if isinstance(item, ApiError):
            yield sse.event(item.body())
            break
        if isinstance(item, str):
            yield chunk([ChatChunkChoice(delta=ChatDelta(content=item))])
            continue
        yield chunk([ChatChunkChoice(delta=ChatDelta(), finish_reason=item.finish_reason)], tandem=item.stats)
        if include_usage:
            yield chunk([], usage=usage(item))
    yield sse.DONE


async def _guarded(stream: TextStream) -> AsyncIterator[str | GenerationOutput | ApiError]:
    """The stream's items; a failure after the first byte becomes an error event, since the HTTP
    status is already sent."""
    try:
        async for item in stream:
            yield item
    except ApiError as exc:  # the engine turns every failure of a generation into an ApiError
        yield exc
