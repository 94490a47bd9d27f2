"""A generation's text as it forms, and what the daemon answers with: ids -> incremental
detokenizer -> stop-string matcher -> text deltas (TextDelta) for the HTTP side as they
complete; the GenerationOutput and its Tandem stats at the end; TextStream, one streaming
generation as an async iterator.

Text <-> ids uses the HF `tokenizers` library only (edge.tokenizer.EdgeTokenizer).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from edge.daemon.detokenizer import make_detokenizer
from edge.daemon.openai_schema import RoundTrace, TandemStats
from edge.daemon.stop import StopMatcher
from edge.link_state import LinkState
from edge.record import GenerationResult
from edge.tokenizer import EdgeTokenizer
from tandem import metrics

if TYPE_CHECKING:
    from concurrent.futures import Future

    from edge.daemon.jobs import GenerationJob

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class TextDelta:
    """A piece of streamed text and what stands behind it: `verified` is True only when every
    token whose bytes are in `text` was checked by the target (a detokenizer may hold a token's
    bytes back into a later delta, so the flag is the AND over all of them); `link_state` is the
    verifier link's state when the delta was released."""
    text: str
    verified: bool
    link_state: LinkState
    tokens: int = 0     # completion tokens emitted so far (continuous usage stats)


OnText = Callable[[TextDelta], None]

@dataclass(frozen=True)
class GenerationOutput:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    stats: TandemStats


@dataclass
class Emitted:
    """What on_tokens has seen of one generation; its times count from `t0`, the request's
    arrival (its wait for a pool slot included, as a client sees it)."""
    t0: float
    token_ids: list[int] = field(default_factory=list)
    verified: list[bool] = field(default_factory=list)
    first_token_s: float | None = None
    text: list[str] = field(default_factory=list)
    pending_verified: bool = True  # AND of the flags of tokens pushed since the last release
    halted: Literal["stop", "timeout", ""] = ""   # why on_tokens ended the generation


class TextOutput:
    """One generation's text: `push` takes each committed chunk of ids (the client's
    on_tokens), releases the text that completed as TextDeltas, and ends the generation at a
    stop string or past the deadline; `finish` flushes what the detokenizer and the stop
    matcher still hold."""

    def __init__(self, tokenizer: EdgeTokenizer, stop_strings: Sequence[str],
                 stop_ids: frozenset[int], timeout_s: float, on_text: OnText | None,
                 link_state: Callable[[], LinkState], arrived_s: float) -> None:
        """`arrived_s`: when the request arrived (time.monotonic()); the deadline counts from
        now, the generation's start."""
        self.detok = make_detokenizer(tokenizer)  # tokenizers' native decode stream
        self.stops = StopMatcher(stop_strings)
        self.stop_ids = stop_ids
        self.token_by_token = bool(stop_strings)
        self.emitted = Emitted(t0=arrived_s)
        self.deadline = time.monotonic() + timeout_s
        self.on_text = on_text
        self.link_state = link_state

    def release(self, text: str) -> None:
        emitted = self.emitted
        if text:
            emitted.text.append(text)
            if self.on_text is not None:
                self.on_text(TextDelta(text, emitted.pending_verified, self.link_state(),
                                       len(emitted.token_ids)))
            emitted.pending_verified = True

    def push(self, ids: list[int], verified: list[bool]) -> bool:
        """Returns False to end the generation (stop string, deadline)."""
        emitted, stops = self.emitted, self.stops
        if emitted.first_token_s is None:
            emitted.first_token_s = time.monotonic() - emitted.t0
        # Token by token when stop strings are set: the output (and completion_tokens) ends
        # with the token that completed a stop string, as in vLLM, not with its block.
        step = 1 if self.token_by_token else max(len(ids), 1)
        for i in range(0, len(ids), step):
            chunk = ids[i:i + step]
            emitted.token_ids.extend(chunk)
            emitted.verified.extend(verified[i:i + step])
            emitted.pending_verified &= all(verified[i:i + step])
            # The eos that ends a generation is part of the client's output, not the text.
            self.release(stops.push(self.detok.push([t for t in chunk if t not in self.stop_ids])))
            if stops.stopped:
                emitted.halted = "stop"
                return False
        if time.monotonic() > self.deadline:
            emitted.halted = "timeout"
            return False
        return True

    def finish(self) -> None:
        if not self.stops.stopped:
            self.release(self.stops.push(self.detok.flush()))
            self.release(self.stops.flush())


def build_stats(result: GenerationResult, emitted: Emitted, wall_s: float, queue_s: float,
                backend: str, trace: bool) -> TandemStats:
    """Tandem's stats of one generation, from the client's round log (tandem.metrics formulas).
    Token counts are what on_tokens saw (a stop string may end the text inside a chunk).
    wall_s and ttft_s count from the request's arrival, queue_s included; tokens_per_s is the
    speed once it had a slot. The trace has the verified rounds and the cloud runs (the
    adaptive controller's other option)."""
    n_tokens = len(emitted.token_ids)
    n_verified = sum(emitted.verified)
    generating_s = wall_s - queue_s
    return TandemStats(
        rounds=result.rounds, accepted_lengths=result.accepted_lengths,
        mean_accepted_length=result.mean_accepted_length,
        target_passes=result.target_passes,
        target_passes_per_token=metrics.passes_per_token(result.target_passes, n_tokens),
        verified_tokens=n_verified, unverified_tokens=n_tokens - n_verified,
        verified_fraction=n_verified / n_tokens if n_tokens else 1.0,
        unverified_by_cause=result.unverified_by_cause(limit=n_tokens - n_verified),
        bytes_up=result.bytes_up, bytes_down=result.bytes_down, wall_s=wall_s, queue_s=queue_s,
        ttft_s=emitted.first_token_s,
        tokens_per_s=n_tokens / generating_s if generating_s > 0 else 0.0,
        reopens=result.reopens,
        moves=result.moves, verifier=result.verifier,
        draft_backend=backend, agreement=result.agreement,
        trace=[RoundTrace(t_s=r.t_start_s + r.draft_s + r.send_s + r.rtt_s, draft_length=r.drafted,
                          accepted=r.accepted or 0, rtt_ms=r.rtt_s * 1000.0,
                          server_ms=(r.server_queue_s + r.server_forward_s + r.server_verify_s)
                          * 1000.0, mode=r.mode, tokens=r.committed)
               for r in result.rounds_log
               if (r.mode == "verify" and r.accepted is not None)
               or (r.mode == "cloud" and r.committed)] if trace else None)


class TextStream:
    """One streaming generation as an async iterator: text deltas (TextDelta) as they complete, then
    the GenerationOutput. Leaving the iteration early (the HTTP client went away) halts the
    generation at its next commit."""

    def __init__(self, submit: Callable[[GenerationJob, OnText, threading.Event, float | None],
                                        Future],
                 job: GenerationJob, arrived_s: float | None = None) -> None:
        """submit: the pool's (GenerationPool.submit), which admits the job or raises."""
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._halt = threading.Event()
        self.prompt_tokens = len(job.request.prompt_ids)
        self._future = submit(job, self._on_text, self._halt, arrived_s)
        # Runs after the worker's last on_text, and call_soon_threadsafe keeps their order.
        self._future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._queue.put_nowait, None))

    def _on_text(self, delta: TextDelta) -> None:  # worker thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, delta)

    def __aiter__(self) -> AsyncIterator[TextDelta | GenerationOutput]:
        return self._items()

    async def _items(self) -> AsyncIterator[TextDelta | GenerationOutput]:
        try:
            while (item := await self._queue.get()) is not None:
                yield item
            yield self._future.result()  # raises the generation's ApiError
        finally:
            self._halt.set()
