"""The daemon's pool of generations: turns jobs into generations with the session client.

It owns what the daemon keeps loaded: a pool of session clients (one draft runtime each; pool
size = generations served at once) and one gRPC channel to the verifier that they share. Each
generation runs in a worker thread (one session each), so many requests run concurrently;
requests beyond the pool wait, and beyond `max_waiting` are refused (503). It also keeps the
link state /healthz and the metrics show. Requests become jobs in jobs.py; a generation's
text forms in output.py.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import grpc

from edge.client import EdgeClient
from edge.config import ClientConfig, DaemonConfig
from edge.daemon.errors import (ApiError, GenerationFailed, GenerationTimeout, QueueFull,
                                ServiceUnavailable, VerifierError)
from edge.daemon.jobs import GenerationJob, JobFactory
from edge.daemon.metrics import DaemonMetrics
from edge.daemon.openai_schema import TandemStats
from edge.daemon.output import (FinishReason, GenerationOutput, OnText, TextOutput, TextStream,
                                build_stats)
from edge.fast_calibration import FastCalibration
from edge.link.errors import CloudUnavailable, ProtocolError, VerifierRefused, VerifierUnavailable
from edge.link.monitor import LinkMonitor
from edge.link_state import LinkState
from edge.record import GenerationResult, RoundRecord
from edge.runtime.base import DraftRuntime
from edge.tokenizer import EdgeTokenizer

log = logging.getLogger(__name__)


class GenerationPool:
    def __init__(self, *, config: DaemonConfig, client_config: ClientConfig, channel: grpc.Channel,
                 runtimes: Sequence[DraftRuntime], tokenizer: EdgeTokenizer, metrics: DaemonMetrics,
                 context_limit: int, metadata: Sequence[tuple[str, str]] = (),
                 monitor: LinkMonitor | None = None,
                 ladders: Sequence[Mapping[str, DraftRuntime]] = ()) -> None:
        """`runtimes`: config.pool_size loaded DraftRuntimes (the pool closes them);
        `context_limit`: most tokens prompt + output may hold (the draft's n_ctx)."""
        assert len(runtimes) == config.pool_size, (len(runtimes), config.pool_size)
        self.config = config
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.jobs = JobFactory(config, tokenizer, context_limit)
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
        self._closed = False

    # ---- running ------------------------------------------------------------------------

    def submit(self, job: GenerationJob, on_text: OnText | None, halt: threading.Event,
               arrived_s: float | None = None) -> Future:
        """Queue a generation; Future[GenerationOutput], failing with an ApiError. Raises
        QueueFull at once when the pool and the wait queue are full. `arrived_s`: when the
        request arrived (time.monotonic(); default now), the origin of its TTFT; its queue_s
        counts from now. Jobs start in the order they were submitted (the executor's queue
        is FIFO)."""
        submitted = time.monotonic()
        arrived_s = submitted if arrived_s is None else arrived_s
        with self._lock:
            if self._closed:
                raise QueueFull("the daemon is shutting down")
            if self.inflight + self.waiting >= self.config.pool_size + self.config.max_waiting:
                raise QueueFull(f"all {self.config.pool_size} sessions are busy and "
                                 f"{self.waiting} requests are waiting; retry later")
            self.waiting += 1
            self._halts.add(halt)
        self.metrics.waiting.inc()
        future = self._executor.submit(self._work, job, on_text, halt, arrived_s, submitted)
        future.add_done_callback(lambda f: self._done(f, halt))
        return future

    def _done(self, future: Future, halt: threading.Event) -> None:
        with self._lock:
            self._halts.discard(halt)
            if future.cancelled():  # never started
                self.waiting -= 1
                self.metrics.waiting.dec()

    async def complete(self, job: GenerationJob, arrived_s: float | None = None) -> GenerationOutput:
        halt = threading.Event()
        future = self.submit(job, None, halt, arrived_s)
        try:
            return await asyncio.wrap_future(future)
        finally:
            halt.set()  # the HTTP request ended (or was dropped): stop if still running

    def stream(self, job: GenerationJob, arrived_s: float | None = None) -> TextStream:
        """Admission happens here, so QueueFull is still an HTTP status, not a stream event."""
        return TextStream(self.submit, job, arrived_s)

    def _work(self, job: GenerationJob, on_text: OnText | None, halt: threading.Event,
              arrived_s: float, submitted: float) -> GenerationOutput:
        with self._lock:
            self.waiting -= 1
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
            client = self._idle.pop()
        queue_s = time.monotonic() - submitted  # the wait for a slot, not the tokenizing
        self.metrics.waiting.dec()
        self.metrics.inflight.inc()
        self.metrics.queue_seconds.observe(queue_s)
        try:
            if halt.is_set():  # its client left while it waited: the slot goes to the next one
                raise GenerationFailed("the request was cancelled", code="cancelled")
            return self._generate(client, job, on_text, halt, arrived_s, queue_s)
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
                  halt: threading.Event, arrived_s: float, queue_s: float) -> GenerationOutput:
        request = job.request
        output = TextOutput(self.tokenizer, job.stop_strings, request.stop_ids,
                            self.config.request_timeout_s, on_text, lambda: self.link_state,
                            arrived_s)
        lossless = (request.mode or client.config.mode) != "fast"

        def on_tokens(ids: list[int], verified: list[bool]) -> bool:
            """Returns False to end the generation (stop string, deadline); a cancelled request
            sets `halt`, the client's stop event, which also ends a verdict wait at once."""
            if lossless:
                self._note_link(all(verified), rounds)
            return output.push(ids, verified)

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
        emitted = output.emitted
        if emitted.halted == "timeout":
            raise GenerationTimeout(f"generation ran past {self.config.request_timeout_s} s")
        if result.finish_reason == "cancelled" and not emitted.halted:
            raise GenerationFailed("the request was cancelled", code="cancelled")
        output.finish()
        wall_s = time.monotonic() - emitted.t0
        finish: FinishReason = "stop" if output.stops.stopped or result.finish_reason == "stop" \
            else "length"
        stats = build_stats(result, emitted, wall_s, queue_s, self.backend, job.trace)
        self._observe(stats, result)
        if stats.unverified_tokens:
            # Loud: one line per request that emitted unverified tokens, naming why.
            log.warning("request emitted %d of %d tokens unverified (verified fraction %.3f); "
                        "cause: %s", stats.unverified_tokens, len(emitted.token_ids),
                        stats.verified_fraction,
                        ", ".join(f"{cause} {n}" for cause, n in stats.unverified_by_cause.items())
                        or "unknown")
        return GenerationOutput(text="".join(emitted.text), token_ids=list(emitted.token_ids),
                                finish_reason=finish, prompt_tokens=len(request.prompt_ids),
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
            wall_s=stats.wall_s - stats.queue_s, ttft_s=stats.ttft_s, reopens=stats.reopens,
            moves=stats.moves)
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


