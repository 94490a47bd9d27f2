"""The verifier engine: validates Open and Draft requests, keeps the session table, sends
forward passes through the batcher and applies the acceptance test. No gRPC here: requests are
plain dataclasses and refusals are cloud.errors exceptions.

Positions (as in the proto): a session's KV cache holds its context minus the last, "pending"
token. A round feeds [pending] + block (k + 1 tokens) and gets k + 1 target distributions; after
the verdict the cache is rolled back to start + n positions and the bonus token becomes the new
pending token, so the context is start + n + 1 tokens long. In fast mode a Draft may carry the
m tokens the edge emitted unverified: the pass feeds [pending] + unverified + block, the last
k + 1 distributions verify the block, and the context becomes start + m + n + 1.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import torch

from cloud.backend import TargetBackend
from cloud.batcher import ForwardResult
from cloud.config import BatchSettings, LimitSettings
from cloud.engine_api import (Discarded, DraftRequest, EvictedNotice, GeneratedToken,
                              GenerateRequest, Limits, Opened, OpenRequest, RoundResult, Timings)
from cloud.errors import (ContextTooLong, InvalidRequest, ModelNotServed, PreconditionFailed,
                          SessionNotFound, ZeroDraftProbability)
from cloud.identity import TargetIdentity, identify
from cloud.metrics import VerifierMetrics
from cloud.pass_cost import PassCosts
from cloud.price import PassPrice
from cloud.runtime.target import TargetRuntime
from cloud.runtime.torch_backend import TorchBackend
from cloud.sessions import Session, SessionTable
from cloud.token_cost import (CLOUD, SPECULATE, PassFit, PassModel, TokenCosts, cpu_clock,
                               job_share_ms, pass_ms)
from cloud.verify import RoundCheck, verify_round
from tandem.codec import InvalidDistribution, SparseDist
from tandem.metrics import tau
from tandem.qcodec import QCodec, codec_for
from tandem.sampling import warp

log = logging.getLogger(__name__)

MODES = (0, 1, 2)  # tandem.v1.Mode: unspecified (= lossless), lossless, fast
MODE_FAST = 2


class Verifier:
    def __init__(self, runtime: TargetRuntime | TargetBackend, limits: LimitSettings,
                 batch: BatchSettings) -> None:
        if not isinstance(runtime, TargetBackend):  # a bare TargetRuntime: the torch backend
            runtime = TorchBackend(runtime, batch)
        runtime.follow_sessions(lambda: self.table.active)  # a batching backend: our sessions
        self.runtime = runtime  # the TargetBackend (cloud/backend.py) every model call goes to
        self.limits = Limits(
            max_draft_length=limits.max_draft_length,
            max_context=min(limits.max_context or runtime.max_context, runtime.max_context),
            vocab_size=runtime.vocab_size,
            max_q_entries=limits.max_q_entries,
            max_in_flight=limits.max_in_flight,
            max_generate_tokens=limits.max_generate_tokens)
        self.table = SessionTable(limits.kv_budget_bytes, limits.max_sessions)
        # What edges check on every open: the served name and a hash of weights and tokenizer.
        self.identity: TargetIdentity = runtime.identity or identify(
            runtime.model_dir, runtime.name, runtime.fingerprint)
        # The price edges read (cloud/price.py), from every job's wait for its pass.
        self.price = PassPrice(batch.target_queue_ms)
        # What a drafted position costs here (cloud/pass_cost.py): the runtime's probe at start
        # over a session's share of the live passes.
        self.pass_costs = PassCosts(runtime.position_ms)
        # What a committed token costs the passes per mode, verifier-wide (cloud/token_cost.py;
        # each session keeps its own: Session.token_costs).
        self.token_costs = TokenCosts()
        self._cpu_clock = cpu_clock(runtime.device) and runtime.batcher is not None
        self._pass_model = runtime.pass_model or PassModel()  # none measured: equal split
        self.pass_fit = PassFit(self._pass_model)  # the live passes' parts (token costs)
        self.metrics = VerifierMetrics(model=runtime.name)
        self.metrics.watch(sessions=lambda: self.table.active,
                           kv_bytes=lambda: self.table.used_bytes,
                           kv_budget_bytes=limits.kv_budget_bytes)
        self.metrics.watch_price(self.price.value, self.price.queue_delay_ms,
                                 self.pass_costs.position_cost)
        self.metrics.watch_token_costs(self.token_costs.per_token_ms)
        self.batcher = runtime.batcher  # the torch backend's; None on vLLM
        # The coded q format this verifier accepts (tandem/qcodec.py), and the time spent
        # decoding it (benchmarks read it: bench/e2e_report.py).
        self.q_codec: QCodec | None = (codec_for(runtime.fingerprint, runtime.vocab_size)
                                       if limits.coded_q else None)
        self.q_decode_s = 0.0
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
        state = self.runtime.new_state(request.sampling)
        session = Session(
            session_id=request.session_id or f"s-{uuid.uuid4().hex[:12]}", params=request.sampling,
            generator=torch.Generator().manual_seed(
                _session_seed(request.sampling.seed, len(context))),
            state=state, context_length=len(context), pending_token=context[-1],
            mode=request.mode, prompt_tokens=len(context),
            q_codec=self.q_codec if self.q_codec is not None
            and self.q_codec.name in request.q_codecs else None)
        for victim in self.table.admit(session, (len(context) - 1) * self.runtime.bytes_per_token):
            self._log_end(victim, "evicted")
        started = time.perf_counter()
        try:
            if len(context) > 1:
                prefill = self.runtime.submit(state, context[:-1], alone=True, rows=0).result()
                self.price.observe(prefill.queue_ms)  # not a pass cost: a prompt
        except BaseException:
            self.table.remove(session)
            raise
        finally:
            self.table.settle(session, state.length * self.runtime.bytes_per_token)
        self.metrics.observe_open(len(context) - 1)
        return Opened(session=session, load=self.table.load,
                      prefill_ms=(time.perf_counter() - started) * 1000.0,
                      q_codec=session.q_codec.name if session.q_codec is not None else "")

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
        self.runtime.check_sampling(request.sampling)  # what this backend cannot score exactly

    # --- Draft ------------------------------------------------------------------------------
    def draft(self, session: Session | None,
              request: DraftRequest) -> RoundResult | EvictedNotice | Discarded:
        """One round: score [pending] + block, verify, roll back, commit."""
        self._check_live(session)
        if session.evicted:
            return EvictedNotice(session.session_id, request.round)
        self._check_send_ahead(request)
        if request.ahead and (request.start != session.context_length
                              or request.assumed_token != session.pending_token):
            return Discarded(request.round, session.context_length)
        q = self._check_draft(session, request)

        k, start, m = len(request.tokens), request.start, len(request.unverified)
        grown = (start + m + k) * self.runtime.bytes_per_token
        victims = self.table.reserve(session, grown)
        if victims is None:  # evicted between the check above and now
            return EvictedNotice(session.session_id, request.round)
        for victim in victims:
            self._log_end(victim, "evicted")
        generator_state = None if session.params.greedy else session.generator.get_state()
        try:
            # m + k + 1 tokens; the last k + 1 distributions verify the block.
            block = [session.pending_token, *request.unverified] + request.tokens
            check = self._round_check(session, request, q)
            result = self.runtime.submit(session.state, block, rows=k + 1, check=check).result()
            self._observe_pass(result)
            verdict, verify_ms = result.verdict, result.verify_ms
            if verdict is None:  # the backend only scored: test here
                verify_started = time.perf_counter()
                verdict = verify_round(check, result.logits)
                verify_ms = (time.perf_counter() - verify_started) * 1000.0
            self.runtime.rollback(session.state, start + m + verdict.accepted)
            self._observe_tokens(session, SPECULATE, result, len(block), m + verdict.accepted + 1)
        except BaseException:
            # Undo the round's positions if the pass ran, and the uniforms it drew: the session
            # is as before the Draft.
            if session.state.length > start - 1:
                self.runtime.rollback(session.state, start - 1)
            if generator_state is not None:
                session.generator.set_state(generator_state)
            raise
        finally:
            self.table.settle(session, session.state.length * self.runtime.bytes_per_token)

        session.pending_token = verdict.token
        session.last_round = request.round
        session.context_length = start + m + verdict.accepted + 1
        session.rounds += 1
        session.accepted_total += verdict.accepted
        session.generated += m + verdict.accepted + 1
        self.metrics.observe_round(k, verdict.accepted, result.batch_size,
                                   result.queue_ms / 1000.0, result.forward_ms / 1000.0,
                                   verify_ms / 1000.0)
        return RoundResult(
            round=request.round, verdict=verdict, context_length=session.context_length,
            timings=Timings(queue_ms=result.queue_ms, forward_ms=result.forward_ms,
                            verify_ms=verify_ms, batch_size=result.batch_size))

    def _check_live(self, session: Session | None) -> None:
        if session is None:
            raise SessionNotFound("no session is open on this stream: send Open first")
        if session.closed:
            raise SessionNotFound(f"session {session.session_id!r} is closed")

    def _check_send_ahead(self, request: DraftRequest) -> None:
        if request.in_flight > self.limits.max_in_flight:
            raise InvalidRequest(f"{request.in_flight} blocks in flight exceed this verifier's "
                                 f"max_in_flight {self.limits.max_in_flight} (Limits)")
        if request.ahead and request.unverified:
            raise InvalidRequest("a block sent ahead cannot carry unverified tokens")

    # --- Generate (cloud-generates) ---------------------------------------------------------
    def generate(self, session: Session | None,
                 request: GenerateRequest) -> Iterator[GeneratedToken | EvictedNotice]:
        """The target's own decoding after the verified context: one forward pass of the pending
        token per generated token, greedy or sampled from the warped p with the session's
        generator (what the target alone would do). Stops after max_tokens or a stop id."""
        self._check_live(session)
        if not 1 <= request.max_tokens <= self.limits.max_generate_tokens:
            raise InvalidRequest(f"Generate.max_tokens is {request.max_tokens}; this verifier "
                                 f"serves 1..{self.limits.max_generate_tokens}")
        if request.start != session.context_length:
            raise PreconditionFailed(f"Generate.start is {request.start} but the session's "
                                     f"context has {session.context_length} tokens")
        for i in range(request.max_tokens):
            if session.evicted:
                yield EvictedNotice(session.session_id, request.round)
                return
            if session.context_length + 1 > self.limits.max_context:
                raise ContextTooLong(f"generating would take the context past max_context "
                                     f"{self.limits.max_context}")
            start = session.context_length
            victims = self.table.reserve(session, start * self.runtime.bytes_per_token)
            if victims is None:
                yield EvictedNotice(session.session_id, request.round)
                return
            for victim in victims:
                self._log_end(victim, "evicted")
            try:
                result = self.runtime.submit(session.state, [session.pending_token]).result()
                self._observe_pass(result)
                self._observe_tokens(session, CLOUD, result, 1, 1)
                logits = result.logits[-1]                                    # [vocab]
                if session.params.greedy:
                    token = int(logits.argmax())
                else:
                    p = warp(logits[None], session.params)[0]                 # [vocab]
                    token = int(torch.multinomial(p.double().cpu(), 1, generator=session.generator))
            except BaseException:
                if session.state.length > start - 1:
                    self.runtime.rollback(session.state, start - 1)
                raise
            finally:
                self.table.settle(session, session.state.length * self.runtime.bytes_per_token)
            session.pending_token = token
            session.context_length = start + 1
            session.generated += 1
            self.metrics.observe_generated()
            done = i == request.max_tokens - 1 or token in request.stop_ids
            yield GeneratedToken(token=token, context_length=session.context_length, done=done,
                                 timings=Timings(queue_ms=result.queue_ms,
                                                 forward_ms=result.forward_ms, verify_ms=0.0,
                                                 batch_size=result.batch_size))
            if done:
                return

    def _round_check(self, session: Session, request: DraftRequest,
                     dists: list[SparseDist]) -> RoundCheck:
        """The round's acceptance test, less the target's rows: dense q and the k + 1 uniforms
        (drawn from the session's generator, as verify_sampled draws them). `dists`: the
        block's q as _check_draft returned it (decoded when coded)."""
        q = None
        if not session.params.greedy:
            vocab = self.limits.vocab_size
            q = torch.zeros((len(request.tokens), vocab), dtype=torch.float64)  # [k, vocab]
            for i, dist in enumerate(dists):
                q[i] = dist.dense(vocab)
        return RoundCheck.make(request.tokens, len(request.unverified), session.params, q,
                               session.generator)

    def _check_draft(self, session: Session, request: DraftRequest) -> list[SparseDist]:
        """Refuse what cannot be verified; returns the block's q (decoded when coded)."""
        k = len(request.tokens)
        if k > self.limits.max_draft_length:
            raise InvalidRequest(f"block of {k} tokens exceeds max_draft_length "
                                 f"{self.limits.max_draft_length}")
        self._check_ids(request.tokens, "tokens")
        if request.round <= session.last_round:
            raise InvalidRequest(f"Draft.round {request.round} does not follow round "
                                 f"{session.last_round}: rounds must increase within a session")
        if request.start != session.context_length:
            raise PreconditionFailed(f"Draft.start is {request.start} but the session's context "
                                     f"has {session.context_length} tokens")
        if request.unverified:
            if session.mode != MODE_FAST:
                raise InvalidRequest("unverified tokens are only accepted in a session opened "
                                     "with MODE_FAST")
            self._check_ids(list(request.unverified), "unverified")
        end = request.start + len(request.unverified) + k + 1
        if end > self.limits.max_context:
            raise ContextTooLong(f"this round could take the context to {end} "
                                 f"tokens, above max_context {self.limits.max_context}")
        if session.params.greedy:
            return []
        q = self._decode_q(session, request) if request.q_coded else request.q
        if len(q) != k:
            raise InvalidRequest(f"sampling needs one q per draft token: {k} tokens, "
                                 f"{len(q)} distributions")
        for i, (token, dist) in enumerate(zip(request.tokens, q)):
            try:
                dist.validate(self.limits.vocab_size, self.limits.max_q_entries)
            except InvalidDistribution as exc:
                raise InvalidRequest(f"q at block position {i}: {exc}") from exc
            if dist.prob_of(token) == 0.0:
                raise ZeroDraftProbability(
                    f"draft token {token} at block position {i} has q = 0: the draft could not "
                    "have sampled it (q must be the distribution the token was drawn from)")
        return q

    def _decode_q(self, session: Session, request: DraftRequest) -> list[SparseDist]:
        if request.q:
            raise InvalidRequest("a Draft carries q or q_coded, not both")
        if session.q_codec is None:
            raise InvalidRequest("Draft.q_coded on a session that negotiated no coded q format "
                                 "(Opened.q_codec is empty)")
        started = time.perf_counter()
        try:
            return session.q_codec.decode(request.q_coded, request.tokens)
        except InvalidDistribution as exc:
            raise InvalidRequest(f"Draft.q_coded: {exc}") from exc
        finally:
            self.q_decode_s += time.perf_counter() - started

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
        self.runtime.close(timeout=30)

    def _observe_pass(self, result: ForwardResult) -> None:
        """A job's pass: its wait (the price) and its share of the pass's time (pass costs)."""
        self.price.observe(result.queue_ms)
        self.pass_costs.observe_job(result)

    def _observe_tokens(self, session: Session, mode: str, result: ForwardResult,
                        positions: int, committed: int) -> None:
        """A job's share of its pass, charged to the tokens it committed in `mode`."""
        self.pass_fit.observe_job(result, pass_ms(result, self._cpu_clock))
        share = job_share_ms(result, positions, self._pass_model, self._cpu_clock,
                             self.pass_fit.coefficients())
        self.token_costs.observe(mode, share, committed)
        session.token_costs.observe(mode, share, committed)

    def charge_serving(self, session: Session, mode: str, ms: float) -> None:
        """A reply's serving CPU (cloud/token_cost.py ServingClock), added to its mode where
        passes are timed by the CPU clock (the same core does both)."""
        if self._cpu_clock:
            self.token_costs.observe(mode, ms, 0)
            session.token_costs.observe(mode, ms, 0)

    def _log_end(self, session: Session, reason: str) -> None:
        # τ as everywhere else (tandem.metrics): 1 + accepted per round, the bonus counted.
        self.metrics.observe_end(reason)
        log.info("session %s %s: %d prompt + %d tokens, %d rounds, τ %.2f, %.2f s",
                 session.session_id or "-", reason, session.prompt_tokens, session.generated,
                 session.rounds, tau(session.accepted_total, session.rounds),
                 time.monotonic() - session.opened_at)


def _session_seed(seed: int, context_length: int) -> int:
    """The session generator's seed: the client's seed mixed with the context length, so a
    re-open after eviction continues with fresh randomness yet stays reproducible."""
    return (seed * 0x9E3779B97F4A7C15 + context_length) % (2**63)
