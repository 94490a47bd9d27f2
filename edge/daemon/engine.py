"""The daemon's engine: turns API requests into generations with the session client.

It owns what the daemon keeps loaded: a pool of session clients (one draft runtime each; pool
size = generations served at once) and one gRPC channel to the verifier that they share. Each
generation runs in a worker thread (one session each), so many requests run concurrently;
requests beyond the pool wait, and beyond `max_waiting` are refused (503).

Text <-> ids uses the HF `tokenizers` library only (edge.tokenizer.EdgeTokenizer). Streaming:
the client's on_tokens callback feeds an incremental detokenizer and the stop-string matcher,
and complete text deltas go to the HTTP side as they form.

Chat prompts: the tokenizer's own chat template when it has one (edge/daemon/chat_template.py);
the shipped code models have none, so theirs is the documented plain join of the contents.
An empty prompt starts a new document: the end-of-text token the model saw between files.
"""
from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import grpc

from edge.client import (CloudUnavailable, EdgeClient, GenerationRequest, GenerationResult,
                         ProtocolError, RoundRecord, VerifierRefused, VerifierUnavailable)
from edge.config import ClientConfig, DaemonConfig
from edge.daemon.chat_template import ChatTemplate, TemplateError, plain_chat_prompt
from edge.daemon.detokenizer import make_detokenizer
from edge.daemon.errors import (ApiError, BadRequest, ContextLengthExceeded, GenerationFailed,
                                GenerationTimeout, ModelNotFound, QueueFull, ServiceUnavailable,
                                VerifierError)
from edge.daemon.metrics import DaemonMetrics
from edge.daemon.openai_schema import (ChatCompletionRequest, ChatMessageIn, CompletionRequest,
                                       ModelCard, ModelList, RoundTrace, TandemStats)
from edge.daemon.stop import StopMatcher
from edge.fast_calibration import FastCalibration
from edge.link.monitor import LinkMonitor
from edge.link_state import LinkState
from edge.runtime.base import DraftRuntime
from edge.tokenizer import EdgeTokenizer
from tandem import metrics
from tandem.sampling import SamplingParams

log = logging.getLogger(__name__)

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

def chat_prompt(messages: Sequence[ChatMessageIn]) -> str:
    """The documented plain prompt of the shipped code models (see chat_template.py)."""
    return plain_chat_prompt([message.template_dict() for message in messages])


@dataclass(frozen=True)
class GenerationJob:
    """One validated generation: everything the worker needs, nothing HTTP."""
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop_strings: tuple[str, ...] = ()
    draft_length: int | None = None   # None = the client config's
    trace: bool = False               # return the per-round trace in the stats
    mode: str | None = None           # lossless | fast; None = the client config's
    max_unverified_run: int | None = None
    min_agreement: float | None = None   # fast mode's target; None = the client config's
    ignore_eos: bool = False          # do not stop at the tokenizer's end of text
    offline: str | None = None        # continue | wait | require_verified; None = client's
    offline_wait_s: float | None = None
    min_tokens_per_s: float | None = None  # speed floor under a priced verifier; None = client


@dataclass(frozen=True)
class GenerationOutput:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    stats: TandemStats


@dataclass
class _Emitted:
    """What on_tokens has seen of one generation."""
    t0: float
    token_ids: list[int] = field(default_factory=list)
    verified: list[bool] = field(default_factory=list)
    first_token_s: float | None = None
    text: list[str] = field(default_factory=list)
    pending_verified: bool = True  # AND of the flags of tokens pushed since the last release
    halted: Literal["stop", "timeout", ""] = ""   # why on_tokens ended the generation


class GenerationPool:
    def __init__(self, *, config: DaemonConfig, client_config: ClientConfig, channel: grpc.Channel,
                 runtimes: Sequence[DraftRuntime], tokenizer: EdgeTokenizer, metrics: DaemonMetrics,
                 context_limit: int, metadata: Sequence[tuple[str, str]] = (),
                 monitor: LinkMonitor | None = None,
                 ladders: Sequence[Mapping[str, DraftRuntime]] = ()) -> None:
        """`runtimes`: config.pool_size loaded DraftRuntimes (the engine closes them);
        `context_limit`: most tokens prompt + output may hold (the draft's n_ctx)."""
        assert len(runtimes) == config.pool_size, (len(runtimes), config.pool_size)
        self.config = config
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.chat_template = ChatTemplate.from_dir(tokenizer.directory) \
            if getattr(tokenizer, "directory", None) else ChatTemplate(None)
        self.context_limit = context_limit
        self.backend = runtimes[0].name
        self._raw_channel = channel
        # One client per runtime: a client's draft cursor knows what its runtime's KV cache
        # holds, so a pooled client also reuses a shared prompt prefix across requests.
        # The link monitor (edge/link/monitor.py) probes the verifier at start and in the
        # background; /healthz and the link-state metric read it, and the clients' offline
        # policies wake on it.
        self.monitor = monitor
        # `ladders`: per pool slot, the ladder's other local models by name (edge.config
        # EdgeConfig.ladder); each client drafts with whichever rung its policy picks.
        calibration = FastCalibration.from_config(client_config.fast)  # one, learnt by all
        self._clients = [EdgeClient(channel, runtime, client_config, metadata=metadata,
                                    monitor=monitor, drafters=ladders[i] if ladders else None,
                                    calibration=calibration)
                         for i, runtime in enumerate(runtimes)]
        self._idle: list[EdgeClient] = list(self._clients)
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=config.pool_size,
                                            thread_name_prefix="tandem-generation")
        self._halts: set[threading.Event] = set()
        self.inflight = 0
        self.peak_inflight = 0
        self.waiting = 0
        self.link_state = LinkState.UP
        self.link_detail = ""
        if monitor is not None:
            monitor.add_listener(self._on_link_status)
            self._on_link_status(monitor.status)
        self.created = int(time.time())
        self._closed = False

    # ---- request -> job (validation; raises ApiError subclasses) --------------------------

    def models(self) -> ModelList:
        return ModelList(data=[self.model_card()])

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.config.model_name, created=self.created,
                         max_model_len=self.context_limit)

    def check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise ModelNotFound(model)

    def completion_job(self, req: CompletionRequest, prompt: str | list[int] | None = None
                       ) -> tuple[GenerationJob, str]:
        """The job and the prompt text (for `echo`) of `prompt` (default: the request's only
        prompt). Tokenizes: call it off the event loop."""
        self.check_model(req.model)
        prompt = req.prompts[0] if prompt is None else prompt
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
        else:
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.tokenizer.vocab_size]
            if bad:
                raise BadRequest(f"token id {bad[0]} outside the vocabulary "
                                     f"[0, {self.tokenizer.vocab_size})", param="prompt")
            text = self.tokenizer.decode(ids)
        return self._job(req, ids, prompt_param="prompt"), text

    def chat_job(self, req: ChatCompletionRequest) -> GenerationJob:
        self.check_model(req.model)
        try:
            text = self.chat_template.render(
                [m.template_dict() for m in req.messages], tools=req.tools,
                add_generation_prompt=req.add_generation_prompt,
                extra=req.chat_template_kwargs)
        except TemplateError as exc:
            raise BadRequest(str(exc), param="messages") from exc
        return self._job(req, self.tokenizer.encode(text), prompt_param="messages")

    def _job(self, req: CompletionRequest | ChatCompletionRequest, ids: list[int],
             prompt_param: str) -> GenerationJob:
        cfg = self.config
        if not ids:
            if self.tokenizer.eos_id is None:
                raise BadRequest("the prompt must not be empty", param=prompt_param)
            ids = [self.tokenizer.eos_id]
        max_tokens = cfg.default_max_tokens if req.max_tokens is None else req.max_tokens
        if max_tokens > cfg.max_tokens_limit:
            raise BadRequest(f"max_tokens is {max_tokens}, this daemon allows at most "
                                 f"{cfg.max_tokens_limit}", param="max_tokens")
        if len(ids) > cfg.max_prompt_tokens:
            raise ContextLengthExceeded(f"the prompt has {len(ids)} tokens, this daemon accepts "
                                        f"at most {cfg.max_prompt_tokens}", param=prompt_param)
        if len(ids) + max_tokens > self.context_limit:
            raise ContextLengthExceeded(
                f"this model's context holds {self.context_limit} tokens; the prompt has {len(ids)} "
                f"and max_tokens asks for {max_tokens} more", param="max_tokens")
        seed = req.seed if req.seed is not None else random.SystemRandom().randrange(2**31)
        # top_k at or above the vocabulary keeps every token: the same as off (0), which is what
        # the verifier accepts.
        top_k = req.top_k if req.top_k < self.tokenizer.vocab_size else 0
        sampling = SamplingParams(temperature=req.temperature, top_k=top_k, top_p=req.top_p, seed=seed)
        return GenerationJob(prompt_ids=tuple(ids), max_tokens=max_tokens, sampling=sampling,
                             stop_strings=tuple(req.stop_strings), draft_length=req.draft_length,
                             trace=req.tandem_trace, mode=req.mode,
                             max_unverified_run=req.max_unverified_run, ignore_eos=req.ignore_eos,
                             min_agreement=req.min_agreement,
                             offline=req.offline, offline_wait_s=req.offline_wait_s,
                             min_tokens_per_s=req.min_tokens_per_s)

    # ---- running ------------------------------------------------------------------------

    def submit(self, job: GenerationJob, on_text: OnText | None, halt: threading.Event) -> Future:
        """Queue a generation; Future[GenerationOutput], failing with an ApiError. Raises
        QueueFull at once when the pool and the wait queue are full."""
        with self._lock:
            if self._closed:
                raise QueueFull("the daemon is shutting down")
            if self.inflight + self.waiting >= self.config.pool_size + self.config.max_waiting:
                raise QueueFull(f"all {self.config.pool_size} sessions are busy and "
                                 f"{self.waiting} requests are waiting; retry later")
            self.waiting += 1
            self._halts.add(halt)
        self.metrics.waiting.inc()
        future = self._executor.submit(self._work, job, on_text, halt)
        future.add_done_callback(lambda f: self._done(f, halt))
        return future

    def _done(self, future: Future, halt: threading.Event) -> None:
        with self._lock:
            self._halts.discard(halt)
            if future.cancelled():  # never started
                self.waiting -= 1
                self.metrics.waiting.dec()

    async def complete(self, job: GenerationJob) -> GenerationOutput:
        halt = threading.Event()
        future = self.submit(job, None, halt)
        try:
            return await asyncio.wrap_future(future)
        finally:
            halt.set()  # the HTTP request ended (or was dropped): stop if still running

    def stream(self, job: GenerationJob) -> TextStream:
        """Admission happens here, so QueueFull is still an HTTP status, not a stream event."""
        return TextStream(self, job)

    def _work(self, job: GenerationJob, on_text: OnText | None, halt: threading.Event) -> GenerationOutput:
        with self._lock:
            self.waiting -= 1
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
            client = self._idle.pop()
        self.metrics.waiting.dec()
        self.metrics.inflight.inc()
        try:
            return self._generate(client, job, on_text, halt)
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - the daemon must outlive any failed generation
            log.exception("generation failed")
            raise GenerationFailed(f"generation failed: {type(exc).__name__}: {exc}") from exc
        finally:
            with self._lock:
                self.inflight -= 1
                self._idle.append(client)
            self.metrics.inflight.dec()

    def _generate(self, client: EdgeClient, job: GenerationJob, on_text: OnText | None,
                  halt: threading.Event) -> GenerationOutput:
        stop_ids = frozenset() if job.ignore_eos else self.tokenizer.stop_ids
        detok = make_detokenizer(self.tokenizer)  # tokenizers' native decode stream
        stops = StopMatcher(job.stop_strings)
        emitted = _Emitted(t0=time.monotonic())
        deadline = emitted.t0 + self.config.request_timeout_s

        def release(text: str) -> None:
            if text:
                emitted.text.append(text)
                if on_text is not None:
                    on_text(TextDelta(text, emitted.pending_verified, self.link_state,
                                      len(emitted.token_ids)))
                emitted.pending_verified = True

        def on_tokens(ids: list[int], verified: list[bool]) -> bool:
            """Returns False to end the generation (stop string, deadline); a cancelled request
            sets `halt`, the client's stop event, which also ends a verdict wait at once."""
            if emitted.first_token_s is None:
                emitted.first_token_s = time.monotonic() - emitted.t0
            if (job.mode or client.config.mode) != "fast":
                self._note_link(all(verified), rounds)
            # Token by token when stop strings are set: the output (and completion_tokens) ends
            # with the token that completed a stop string, as in vLLM, not with its block.
            step = 1 if job.stop_strings else max(len(ids), 1)
            for i in range(0, len(ids), step):
                chunk = ids[i:i + step]
                emitted.token_ids.extend(chunk)
                emitted.verified.extend(verified[i:i + step])
                emitted.pending_verified &= all(verified[i:i + step])
                # The eos that ends a generation is part of the client's output, not the text.
                release(stops.push(detok.push([t for t in chunk if t not in stop_ids])))
                if stops.stopped:
                    emitted.halted = "stop"
                    return False
            if time.monotonic() > deadline:
                emitted.halted = "timeout"
                return False
            return True

        request = GenerationRequest(prompt_ids=list(job.prompt_ids), max_tokens=job.max_tokens,
                                    sampling=job.sampling, draft_length=job.draft_length,
                                    mode=job.mode, max_unverified_run=job.max_unverified_run,
                                    min_agreement=job.min_agreement,
                                    stop_ids=stop_ids, offline=job.offline,
                                    offline_wait_s=job.offline_wait_s,
                                    min_tokens_per_s=job.min_tokens_per_s)
        rounds: list[RoundRecord] = []  # as they happen, for the link state
        try:
            result = client.generate(request, on_tokens, on_round=rounds.append, stop_event=halt)
        except VerifierRefused as exc:
            raise VerifierError(str(exc), code="verifier_refused") from exc
        except (CloudUnavailable, VerifierUnavailable) as exc:
            # The verifier is away and the request cannot be served without it: 503, so a
            # client retries later (Retry-After), not 500 as for a failed generation.
            raise ServiceUnavailable(str(exc)) from exc
        except ProtocolError as exc:
            raise VerifierError(f"protocol error: {exc}", code="protocol_error") from exc
        if emitted.halted == "timeout":
            raise GenerationTimeout(f"generation ran past {self.config.request_timeout_s} s")
        if result.finish_reason == "cancelled" and not emitted.halted:
            raise GenerationFailed("the request was cancelled", code="cancelled")
        if not stops.stopped:
            release(stops.push(detok.flush()))
            release(stops.flush())
        wall_s = time.monotonic() - emitted.t0
        finish: FinishReason = "stop" if stops.stopped or result.finish_reason == "stop" else "length"
        stats = build_stats(result, emitted, wall_s, self.backend, job.trace)
        self._observe(stats, result)
        if stats.unverified_tokens:
            # Loud: one line per request that emitted unverified tokens, naming why.
            log.warning("request emitted %d of %d tokens unverified (verified fraction %.3f); "
                        "cause: %s", stats.unverified_tokens, len(emitted.token_ids),
                        stats.verified_fraction,
                        ", ".join(f"{cause} {n}" for cause, n in stats.unverified_by_cause.items())
                        or "unknown")
        return GenerationOutput(text="".join(emitted.text), token_ids=list(emitted.token_ids),
                                finish_reason=finish, prompt_tokens=len(job.prompt_ids),
                                completion_tokens=len(emitted.token_ids), stats=stats)

    def _on_link_status(self, status) -> None:
        """The monitor probed: its state is the link state (exact, not learnt from requests)."""
        self.link_detail = status.detail
        self._set_link_state(status.state, status.detail)

    def _set_link_state(self, state: LinkState, detail: str = "") -> None:
        if state != self.link_state:
            log.warning("verifier link %s -> %s%s", self.link_state, state,
                        f": {detail}" if detail else "")
            self.link_state = state
            self.metrics.set_link_state(state)

    def _note_link(self, verified: bool, rounds: Sequence[RoundRecord]) -> None:
        """Link state for /metrics and /healthz: down while tokens come unverified (the client
        decodes locally), degraded when verification goes on but needed a re-open (a round
        re-sent, or local rounds before), else up. With a monitor, its probed state wins."""
        if self.monitor is not None:
            return
        if not verified:
            self._set_link_state(LinkState.DOWN, "tokens are generated locally, unverified")
        elif any(r.attempts > 1 or r.mode == "local" for r in rounds):
            self._set_link_state(LinkState.DEGRADED)
        else:
            self._set_link_state(LinkState.UP)

    def _observe(self, stats: TandemStats, result: GenerationResult) -> None:
        answered = result.verified_rounds
        self.metrics.observe_rounds(draft_lengths=[r.drafted for r in answered],
                                    accepted=stats.accepted_lengths,
                                    rtts_s=[r.rtt_s for r in answered])
        self.metrics.observe_generation(
            verified=stats.verified_tokens, unverified=stats.unverified_tokens,
            target_passes=stats.target_passes, bytes_up=stats.bytes_up, bytes_down=stats.bytes_down,
            wall_s=stats.wall_s, ttft_s=stats.ttft_s, reopens=stats.reopens, moves=stats.moves)
        self.metrics.observe_unverified(stats.unverified_by_cause)

    # ---- lifecycle ----------------------------------------------------------------------

    def health(self) -> dict:
        with self._lock:
            # Misconfigured (TLS, key, identity): every request would be refused, so not ok.
            # Starting: the verifier was never reached yet; a request would wait for it
            # (offline: wait), so an orchestrator should not route traffic here yet.
            if self.link_state is LinkState.MISCONFIGURED:
                status = "misconfigured"
            elif self.monitor is not None and not self.monitor.ever_up:
                status = "starting"
            else:
                status = "ok"
            body = {"status": status, "model": self.config.model_name,
                    "draft_backend": self.backend,
                    "pool_size": self.config.pool_size, "inflight": self.inflight,
                    "waiting": self.waiting, "peak_inflight": self.peak_inflight,
                    "link_state": self.link_state}
        if self.monitor is not None:
            body.update(self.monitor.status.as_dict())
        return body

    def close(self) -> None:
        """Stop taking requests, halt running generations at their next commit, wait for the
        workers, then release the runtimes and the channel."""
        with self._lock:
            self._closed = True
            halts = list(self._halts)
        for halt in halts:
            halt.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        for client in self._clients:
            for cursor in client.cursors.values():  # the draft and the ladder's other rungs
                cursor.runtime.close()
        if self.monitor is not None:
            self.monitor.stop()
        self._raw_channel.close()


def build_stats(result: GenerationResult, emitted: _Emitted, wall_s: float, backend: str,
                trace: bool) -> TandemStats:
    """Tandem's stats of one generation, from the client's round log (tandem.metrics formulas).
    Token counts are what on_tokens saw (a stop string may end the text inside a chunk). The
    trace has the verified rounds and the cloud runs (the adaptive controller's other option)."""
    n_tokens = len(emitted.token_ids)
    n_verified = sum(emitted.verified)
    return TandemStats(
        rounds=result.rounds, accepted_lengths=result.accepted_lengths,
        mean_accepted_length=result.mean_accepted_length,
        target_passes=result.target_passes,
        target_passes_per_token=metrics.passes_per_token(result.target_passes, n_tokens),
        verified_tokens=n_verified, unverified_tokens=n_tokens - n_verified,
        verified_fraction=n_verified / n_tokens if n_tokens else 1.0,
        unverified_by_cause=result.unverified_by_cause(limit=n_tokens - n_verified),
        bytes_up=result.bytes_up, bytes_down=result.bytes_down, wall_s=wall_s,
        ttft_s=emitted.first_token_s,
        tokens_per_s=n_tokens / wall_s if wall_s > 0 else 0.0, reopens=result.reopens,
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

    def __init__(self, engine: GenerationPool, job: GenerationJob) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._halt = threading.Event()
        self.prompt_tokens = len(job.prompt_ids)
        self._future = engine.submit(job, self._on_text, self._halt)
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
