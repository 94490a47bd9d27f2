"""The verifier engine: validates Open and Draft requests, keeps the session table, sends
forward passes through the batcher and applies the acceptance test. No gRPC here: requests are
plain dataclasses and refusals are cloud.errors exceptions.

Positions (as in the proto): a session's KV cache holds its context minus the last, "pending"
token. A round feeds [pending] + block (k + 1 tokens) and gets k + 1 target distributions; after
the verdict the cache is rolled back to start + n positions and the bonus token becomes the new
pending token, so the context is start + n + 1 tokens long.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import torch

from cloud.batcher import Batcher
from cloud.config import BatchSettings, LimitSettings
from cloud.errors import (ContextTooLong, InvalidRequest, ModelNotServed, PreconditionFailed,
                          SessionNotFound, ZeroDraftProbability)
from cloud.runtime.target import TargetRuntime
from cloud.sessions import Session, SessionTable
from cloud.verify import Verdict, verify_greedy, verify_sampled
from tandem.codec import InvalidDistribution, SparseDist
from tandem.sampling import SamplingParams, warp

log = logging.getLogger(__name__)

MODES = (0, 1, 2)  # tandem.v1.Mode: unspecified (= lossless), lossless, fast


@dataclass(frozen=True)
class Limits:
    max_draft_length: int
    max_context: int
    vocab_size: int
    max_q_entries: int


@dataclass(frozen=True)
class OpenRequest:
    session_id: str
    model: str
    tokenizer_fingerprint: str
    context_ids: list[int]
    sampling: SamplingParams
    mode: int = 0


@dataclass(frozen=True)
class Opened:
    session: Session
    load: float
    prefill_ms: float


@dataclass(frozen=True)
class DraftRequest:
    round: int
    start: int
    tokens: list[int]
    q: list[SparseDist]  # one per token when sampling; ignored for greedy


@dataclass(frozen=True)
class Timings:
    queue_ms: float
    forward_ms: float
    verify_ms: float
    batch_size: int


@dataclass(frozen=True)
class RoundResult:
    round: int
    verdict: Verdict
    context_length: int  # start + accepted + 1
    timings: Timings


@dataclass(frozen=True)
class EvictedNotice:
    session_id: str
    round: int


class Engine:
    def __init__(self, runtime: TargetRuntime, limits: LimitSettings, batch: BatchSettings) -> None:
        self.runtime = runtime
        self.limits = Limits(
            max_draft_length=limits.max_draft_length,
            max_context=min(limits.max_context or runtime.max_context, runtime.max_context),
            vocab_size=runtime.vocab_size,
            max_q_entries=limits.max_q_entries)
        self.table = SessionTable(limits.kv_budget_bytes, limits.max_sessions)
        self.batcher = Batcher(runtime.forward, max_batch=batch.max_batch,
                               window_ms=batch.window_ms,
                               active_sessions=lambda: self.table.active)
        if limits.kv_budget_bytes < self.limits.max_context * runtime.bytes_per_token:
            log.warning("kv_budget_bytes (%d) is below one full-length session (%d tokens x %d "
                        "bytes): long contexts will be refused", limits.kv_budget_bytes,
                        self.limits.max_context, runtime.bytes_per_token)

    # --- Open -------------------------------------------------------------------------------
    def open(self, request: OpenRequest) -> Opened:
        """Validate (everything that can be refused is refused before any compute), admit the
        session, prefill context[:-1]."""
        self._check_open(request)
        context = request.context_ids
        state = self.runtime.new_state()
        session = Session(
            session_id=request.session_id or f"s-{uuid.uuid4().hex[:12]}", params=request.sampling,
            generator=torch.Generator().manual_seed(
                _session_seed(request.sampling.seed, len(context))),
            state=state, context_length=len(context), pending_token=context[-1],
            mode=request.mode, prompt_tokens=len(context))
        for victim in self.table.admit(session, (len(context) - 1) * self.runtime.bytes_per_token):
            self._log_end(victim, "evicted")
        started = time.perf_counter()
        try:
            if len(context) > 1:
                self.batcher.submit(state, context[:-1], alone=True).result()
        except BaseException:
            self.table.remove(session)
            raise
        finally:
            self.table.settle(session, state.length * self.runtime.bytes_per_token)
        return Opened(session=session, load=self.table.load,
                      prefill_ms=(time.perf_counter() - started) * 1000.0)

    def _check_open(self, request: OpenRequest) -> None:
        if request.model and request.model != self.runtime.name:
            raise ModelNotServed(f"model {request.model!r} is not served here; this server serves "
                                 f"{self.runtime.name!r}")
        if request.tokenizer_fingerprint != self.runtime.fingerprint:
            raise PreconditionFailed(
                f"tokenizer fingerprint {request.tokenizer_fingerprint!r} does not match the "
                f"target's {self.runtime.fingerprint!r}: the draft reads token ids differently")
        if not request.context_ids:
            raise InvalidRequest("context_ids is empty: Open needs at least one token")
        self._check_ids(request.context_ids, "context_ids")
        if len(request.context_ids) > self.limits.max_context:
            raise ContextTooLong(f"context of {len(request.context_ids)} tokens exceeds "
                                 f"max_context {self.limits.max_context}")
        if request.mode not in MODES:
            raise InvalidRequest(f"unknown mode {request.mode}")

    # --- Draft ------------------------------------------------------------------------------
    def draft(self, session: Session | None, request: DraftRequest) -> RoundResult | EvictedNotice:
        """One round: score [pending] + block, verify, roll back, commit."""
        if session is None:
            raise SessionNotFound("no session is open on this stream: send Open first")
        if session.closed:
            raise SessionNotFound(f"session {session.session_id!r} is closed")
        if session.evicted:
            return EvictedNotice(session.session_id, request.round)
        self._check_draft(session, request)

        k, start = len(request.tokens), request.start
        grown = (start + k) * self.runtime.bytes_per_token
        victims = self.table.reserve(session, grown)
        if victims is None:  # evicted between the check above and now
            return EvictedNotice(session.session_id, request.round)
        for victim in victims:
            self._log_end(victim, "evicted")
        try:
            block = [session.pending_token] + request.tokens                  # k + 1 tokens
            result = self.batcher.submit(session.state, block).result()
            verify_started = time.perf_counter()
            verdict = self._verify(session, request, result.logits)
            verify_ms = (time.perf_counter() - verify_started) * 1000.0
            self.runtime.rollback(session.state, start + verdict.accepted)
        except BaseException:
            # Undo the round's positions if the pass ran: the session is as before the Draft.
            if session.state.length > start - 1:
                self.runtime.rollback(session.state, start - 1)
            raise
        finally:
            self.table.settle(session, session.state.length * self.runtime.bytes_per_token)

        session.pending_token = verdict.token
        session.context_length = start + verdict.accepted + 1
        session.rounds += 1
        session.accepted_total += verdict.accepted
        session.generated += verdict.accepted + 1
        return RoundResult(
            round=request.round, verdict=verdict, context_length=session.context_length,
            timings=Timings(queue_ms=result.queue_ms, forward_ms=result.forward_ms,
                            verify_ms=verify_ms, batch_size=result.batch_size))

    def _verify(self, session: Session, request: DraftRequest, logits: torch.Tensor) -> Verdict:
        draft_tokens = torch.tensor(request.tokens, dtype=torch.long)        # [k]
        if session.params.greedy:
            return verify_greedy(draft_tokens, logits)
        p = warp(logits, session.params)                                      # [k + 1, vocab]
        q = torch.zeros((len(request.tokens), logits.shape[1]), dtype=torch.float64)  # [k, vocab]
        for i, dist in enumerate(request.q):
            q[i] = dist.dense(logits.shape[1])
        return verify_sampled(draft_tokens, q, p, session.generator)

    def _check_draft(self, session: Session, request: DraftRequest) -> None:
        k = len(request.tokens)
        if k > self.limits.max_draft_length:
            raise InvalidRequest(f"block of {k} tokens exceeds max_draft_length "
                                 f"{self.limits.max_draft_length}")
        self._check_ids(request.tokens, "tokens")
        if request.start != session.context_length:
            raise PreconditionFailed(f"Draft.start is {request.start} but the session's context "
                                     f"has {session.context_length} tokens")
        if request.start + k + 1 > self.limits.max_context:
            raise ContextTooLong(f"this round could take the context to {request.start + k + 1} "
                                 f"tokens, above max_context {self.limits.max_context}")
        if session.params.greedy:
            return
        if len(request.q) != k:
            raise InvalidRequest(f"sampling needs one q per draft token: {k} tokens, "
                                 f"{len(request.q)} distributions")
        for i, (token, dist) in enumerate(zip(request.tokens, request.q)):
            try:
                dist.validate(self.limits.vocab_size, self.limits.max_q_entries)
            except InvalidDistribution as exc:
                raise InvalidRequest(f"q at block position {i}: {exc}") from exc
            if dist.prob_of(token) == 0.0:
                raise ZeroDraftProbability(
                    f"draft token {token} at block position {i} has q = 0: the draft could not "
                    "have sampled it (q must be the distribution the token was drawn from)")

    def _check_ids(self, ids: list[int], name: str) -> None:
        bad = [i for i, token in enumerate(ids) if not 0 <= token < self.limits.vocab_size]
        if bad:
            raise InvalidRequest(f"{name}[{bad[0]}] = {ids[bad[0]]} is out of range "
                                 f"[0, {self.limits.vocab_size})")

    # --- Close ------------------------------------------------------------------------------
    def close(self, session: Session, reason: str) -> None:
        """End a session; idempotent and safe from any thread (gRPC's termination callback calls
        it while the stream's handler may still wait on a round). Logs its one summary line (an
        evicted session was logged when it was evicted). The KV cache is not released here: a
        round in flight keeps using it and the table keeps charging it until the round settles;
        it goes with the last reference to the session."""
        session.closed = True
        if self.table.remove(session):  # True for exactly one caller
            self._log_end(session, reason)

    def shutdown(self) -> None:
        self.batcher.close(timeout=30)

    def _log_end(self, session: Session, reason: str) -> None:
        log.info("session %s %s: %d prompt + %d tokens, %d rounds, mean accepted %.2f, %.2f s",
                 session.session_id or "-", reason, session.prompt_tokens, session.generated,
                 session.rounds, session.mean_accepted, time.monotonic() - session.opened_at)


def _session_seed(seed: int, context_length: int) -> int:
    """The session generator's seed: the client's seed mixed with the context length, so a
    re-open after eviction continues with fresh randomness yet stays reproducible."""
    return (seed * 0x9E3779B97F4A7C15 + context_length) % (2**63)
