"""GenerationPool output -> OpenAI response bodies and SSE chunk streams (pure functions and small async
generators; the handlers in app.py only pick one)."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from edge.daemon import sse
from edge.daemon.output import GenerationOutput, TextDelta, TextStream
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
    TandemDelta,
    Usage,
)


OnDone = Callable[[Sequence[GenerationOutput]], None]  # a stream's outputs, once it ended


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def token_usage(prompt: int, completion: int) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def usage(out: GenerationOutput) -> Usage:
    return token_usage(out.prompt_tokens, out.completion_tokens)


def completion_response(outs: Sequence[GenerationOutput], model: str,
                        echo_texts: Sequence[str] = (),
                        token_ids: bool = False) -> CompletionResponse:
    """One choice per prompt (`index` in order); usage summed over them. `tandem` holds the
    first choice's stats (the only one for one prompt); each choice carries its own when there
    are several."""
    echoes = list(echo_texts) or [""] * len(outs)
    several = len(outs) > 1
    return CompletionResponse(
        id=new_id("cmpl"), created=int(time.time()), model=model,
        choices=[CompletionChoice(index=i, text=echo + out.text, finish_reason=out.finish_reason,
                                  token_ids=list(out.token_ids) if token_ids else None,
                                  tandem=out.stats if several else None)
                 for i, (out, echo) in enumerate(zip(outs, echoes))],
        usage=total_usage(outs), tandem=outs[0].stats)


# Response headers a plain OpenAI client can read without parsing Tandem's body field: the
# share of the completion the target verified, and how many tokens it did not. A stream's
# headers leave before its tokens: its last chunk's `tandem` stats say the same.
VERIFIED_FRACTION_HEADER = "x-tandem-verified-fraction"
UNVERIFIED_TOKENS_HEADER = "x-tandem-unverified-tokens"


def verification_headers(outs: Sequence[GenerationOutput]) -> dict[str, str]:
    verified = sum(out.stats.verified_tokens for out in outs)
    unverified = sum(out.stats.unverified_tokens for out in outs)
    total = verified + unverified
    return {VERIFIED_FRACTION_HEADER: f"{verified / total if total else 1.0:.4f}",
            UNVERIFIED_TOKENS_HEADER: str(unverified)}


def total_usage(outs: Sequence[GenerationOutput]) -> Usage:
    return token_usage(sum(out.prompt_tokens for out in outs),
                       sum(out.completion_tokens for out in outs))


def chat_response(out: GenerationOutput, model: str) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=new_id("chatcmpl"), created=int(time.time()), model=model,
        choices=[ChatChoice(message=ChatMessageOut(content=out.text), finish_reason=out.finish_reason)],
        usage=usage(out), tandem=out.stats)


def delta_stats(delta: TextDelta) -> TandemDelta:
    return TandemDelta(verified=delta.verified, link_state=delta.link_state)


def usage_so_far(stream: TextStream, delta: TextDelta) -> Usage:
    return token_usage(stream.prompt_tokens, delta.tokens)


async def completion_events(streams: Sequence[Callable[[], TextStream]], model: str,
                            include_usage: bool, echo_texts: Sequence[str] = (),
                            on_done: OnDone | None = None,
                            continuous_usage: bool = False) -> AsyncIterator[bytes]:
    """SSE chunks of /v1/completions: for each prompt in turn (choice `index`), text deltas
    (each with its TandemDelta: verified or not, and the link state), then a chunk with
    finish_reason and the `tandem` stats; then (stream_options.include_usage) a usage chunk
    with no choices (continuous_usage: usage so far in every content chunk too). A choice's
    first chunk goes out with its first text (`echo`'s prompt text in front of it), never
    before: a request waiting for a pool slot sends nothing. `streams` start their generation
    when called (the first one should already be admitted, so an overload is still an HTTP
    status)."""
    cid, created = new_id("cmpl"), int(time.time())
    echoes = list(echo_texts) or [""] * len(streams)
    outs: list[GenerationOutput] = []

    def chunk(choices: list[CompletionChoice], **extra) -> bytes:
        return sse.event(CompletionResponse(id=cid, created=created, model=model, choices=choices, **extra))

    for index, (start, echo_text) in enumerate(zip(streams, echoes)):
        def text(piece: str, finish_reason: str | None = None) -> list[CompletionChoice]:
            return [CompletionChoice(index=index, text=piece, finish_reason=finish_reason)]

        try:
            stream = start()
        except ApiError as exc:
            yield sse.event(exc.body())
            break
        failed = False
        async for item in _guarded(stream):
            if isinstance(item, ApiError):
                yield sse.event(item.body())
                failed = True
                break
            if isinstance(item, TextDelta):
                yield chunk(text(echo_text + item.text), tandem=delta_stats(item),
                            usage=usage_so_far(stream, item) if continuous_usage else None)
                echo_text = ""
                continue
            outs.append(item)
            yield chunk(text(echo_text, item.finish_reason), tandem=item.stats)
        if failed:
            break
    if outs and include_usage:
        yield chunk([], usage=total_usage(outs))
    if on_done is not None:
        on_done(outs)
    yield sse.DONE


async def chat_events(stream: TextStream, model: str, include_usage: bool,
                      on_done: OnDone | None = None,
                      continuous_usage: bool = False) -> AsyncIterator[bytes]:
    """SSE chunks of /v1/chat/completions: content deltas, the first one with the role (as
    vLLM sends it: role and first text together, so a client's TTFT is the first token's; a
    request waiting for a pool slot sends nothing), a chunk with finish_reason and the `tandem`
    stats, then (include_usage) a usage chunk with no choices. Content chunks carry a
    TandemDelta: verified or not, and the link state."""
    cid, created = new_id("chatcmpl"), int(time.time())
    role: str | None = "assistant"  # in the first chunk only

    def chunk(choices: list[ChatChunkChoice], **extra) -> bytes:
        return sse.event(ChatCompletionChunk(id=cid, created=created, model=model, choices=choices, **extra))

    async for item in _guarded(stream):
        if isinstance(item, ApiError):
            yield sse.event(item.body())
            break
        if isinstance(item, TextDelta):
            yield chunk([ChatChunkChoice(delta=ChatDelta(role=role, content=item.text))],
                        tandem=delta_stats(item),
                        usage=usage_so_far(stream, item) if continuous_usage else None)
            role = None
            continue
        if role is not None:  # no text at all (an eos first): the role still comes first
            yield chunk([ChatChunkChoice(delta=ChatDelta(role=role, content=""))])
        yield chunk([ChatChunkChoice(delta=ChatDelta(), finish_reason=item.finish_reason)], tandem=item.stats)
        if include_usage:
            yield chunk([], usage=usage(item))
        if on_done is not None:
            on_done([item])
    yield sse.DONE


async def _guarded(stream: TextStream) -> AsyncIterator[TextDelta | GenerationOutput | ApiError]:
    """The stream's items; a failure after the first byte becomes an error event, since the HTTP
    status is already sent."""
    try:
        async for item in stream:
            yield item
    except ApiError as exc:  # the pool turns every failure of a generation into an ApiError
        yield exc
