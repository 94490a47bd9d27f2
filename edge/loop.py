"""The round loop of one generation: ask the policy, draft, send, apply the verdict, record.

Per round (vocabulary: protos/tandem/v1/decoding.proto):
1. the policy sees a RoundView (what has happened, the caps) and answers a Plan (k, confidence
   stop, verify or not, q entries);
2. the draft runtime's cache is synced to the context (prompt + every committed token) and the
   draft proposes a block of up to k tokens (greedy: argmax; sampling: a sample from the sparse,
   quantized q that travels with the block, so the verifier's acceptance uses the true q);
3. the link sends Draft(round, start = context length, tokens, q) and awaits the Verdict
   (accepted length n, bonus token); draft[:n] + [bonus] is committed, and the next sync rolls
   the draft back to that prefix;
4. one RoundRecord goes to the log, to the policy (update) and to on_round.

Server state is soft. On Evicted, or a broken link, the loop re-opens with its full context and
redoes the round, losing nothing. If the verifier stays unreachable past a deadline, the draft
generates alone (those tokens have verified=False, rounds of mode "local") and the loop tries
to re-open every few tokens; verification resumes from the full context.

A generation stops early when the caller's stop event is set or on_tokens returns False
(finish_reason "cancelled"); a stop ends a verdict wait, an open or a backoff sleep at once
(within edge.link.STOP_POLL_S), not at the next commit.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import grpc

from edge.config import DEFAULT_DRAFTER, ClientConfig
from edge.control.offline import OfflineControl, OfflineMode
from edge.control.policy import DraftPolicy, Plan, RoundView
from edge.drafting import Block, DraftCursor, TokenChooser
from edge.link import Evicted, Stopped, VerifierLink
from edge.pipeline import Pipeline
from edge.rounds import GenerationResult, RoundRecord
from edge.runtime.base import DraftRuntime
from edge.session_stream import (CloudUnavailable, LinkDown, VerifierMisconfigured,
                                 VerifierRefused, VerifierUnavailable)
from tandem.v1 import decoding_pb2 as pb

# on_tokens(ids, verified) -> False stops the generation (None or True go on).
OnTokens = Callable[[list[int], list[bool]], "bool | None"]
OnRound = Callable[[RoundRecord], None]


def block_length(draft_length: int, remaining: int, context_length: int, *,
                 max_draft_length: int | None = None, max_context: int | None = None) -> int | None:
    """How many tokens to draft this round, or None when no round fits (context full).

    A round emits up to k + 1 tokens (the bonus token), so k <= remaining - 1 never drafts past
    max_tokens; k = 0 makes the verdict's token the target's plain next token. The round takes
    the context to start + n + 1 <= start + k + 1, which must fit max_context. None = no limit.
    """
    assert remaining >= 1, "no tokens left to generate"
    k = min(draft_length, remaining - 1)
    if max_draft_length is not None:
        k = min(k, max_draft_length)
    if max_context is not None:
        room = max_context - context_length
        if room < 1:
            return None
        k = min(k, room - 1)
    return max(k, 0)


def truncate(tokens: list[int], room: int, stop_ids: frozenset[int]) -> tuple[list[int], str]:
    """Cut tokens to at most `room` and right after the first stop id; return them and the
    finish reason they cause ("stop", "length", or "" to go on)."""
    for i, token in enumerate(tokens[:room]):
        if token in stop_ids:
            return tokens[: i + 1], "stop"
    tokens = tokens[:room]
    return tokens, ("length" if len(tokens) >= room else "")


class _Stop(Exception):
    """Unwinds the loop when the caller stopped the generation."""


class Generation:
    """The state of one generation and its round loop."""

    def __init__(self, *, request, draft: DraftRuntime, cursor: DraftCursor,
                 config: ClientConfig, policy: DraftPolicy, link: VerifierLink,
                 on_tokens: OnTokens | None = None, on_round: OnRound | None = None,
                 stop_event: threading.Event | None = None,
                 jitter_rng: random.Random | None = None,
                 cursors: Mapping[str, DraftCursor] | None = None, fast: bool = False,
                 max_unverified_run: int = 0, offline: OfflineControl | None = None) -> None:
        self.request = request
        # Deadlines from the measured link, the circuit breaker, the monitor and the request's
        # offline mode (edge/control/offline.py).
        self.offline_ctl = offline if offline is not None else OfflineControl(config)
        link.wait_rule = self.offline_ctl.wait_rule()
        self.draft = draft
        self.cursor = cursor
        # The local models by ladder name (`cursor` is the default one, "draft").
        self.cursors = dict(cursors) if cursors else {DEFAULT_DRAFTER: cursor}
        # Fast mode: a skippable block (Plan.verify False) is committed unverified while the
        # unverified run stays within max_unverified_run; the next verified block carries
        # those tokens to the verifier (VerifierLink.send's `unverified`).
        self.fast = fast
        self.max_unverified_run = max_unverified_run
        self.unverified_run = 0      # tokens committed unverified since the last verified one
        self.force_verify = False    # the last skipped span ended on an unsure position
        self.config = config
        self.policy = policy
        self.link = link
        self.on_tokens = on_tokens
        self.on_round = on_round
        self.stop_event = stop_event
        self.jitter_rng = jitter_rng or random.Random()
        self.chooser = TokenChooser(request.sampling, config.q_scale)
        self.context = [int(t) for t in request.prompt_ids]
        self.result = GenerationResult()
        self.halted = False          # on_tokens returned False
        self.offline = False
        self.next_probe_at = 0       # while offline: re-open once this many tokens are committed
        self.t0 = 0.0
        link.should_stop = self.stopped
        self.pipeline = Pipeline(self)  # draft-ahead, send-ahead, cloud-generates

    # ---- the loop -------------------------------------------------------------------------

    def stopped(self) -> bool:
        return self.halted or (self.stop_event is not None and self.stop_event.is_set())

    def run(self) -> GenerationResult:
        self.t0 = time.monotonic()
        try:
            # Prefill the draft while nothing else runs, unless the policy defers it to its
            # first block (one that starts by letting the cloud generate may never draft).
            if getattr(self.policy, "prefill_first", True):
                self.cursor.sync(self.context)
            if not self._open_with_retries() and not self._verifier_back():
                self._go_offline()
            while not self.result.finish_reason:
                if self.stopped():
                    raise _Stop()
                if self.offline:
                    self._offline_stretch()
                    continue
                self._round()
        except (_Stop, Stopped):
            self.result.finish_reason = self.result.finish_reason or "cancelled"
            self.link.drop()
        finally:
            self.link.close("done")
            r = self.result
            r.bytes_up, r.bytes_down = self.link.bytes_up, self.link.bytes_down
            r.draft_bytes_up, r.drafted_tokens = self.link.draft_bytes_up, self.link.drafted_tokens
            r.wall_s = time.monotonic() - self.t0
            r.reopens = max(self.link.opens - 1, 0)
        return self.result

    @property
    def max_context(self) -> int:
        """The longest context both sides can hold: the server's limit and the draft's cache."""
        n_ctx = min(c.runtime.n_ctx for c in self.cursors.values())
        limits = self.link.limits
        if limits is not None and limits.max_context:
            return min(limits.max_context, n_ctx)
        return n_ctx

    def _view(self, max_k: int) -> RoundView:
        limits = self.link.limits
        max_q = self.config.max_q_entries
        if limits is not None and limits.max_q_entries:
            max_q = min(max_q, limits.max_q_entries)
        generated = len(self.result.token_ids)
        return RoundView(round=len(self.result.rounds_log), generated=generated,
                         remaining=self.request.max_tokens - generated, max_k=max_k,
                         link_state="offline" if self.offline else "up",
                         sampling=not self.request.sampling.greedy,
                         history=self.result.rounds_log, context_length=len(self.context),
                         max_q_entries=max_q, server_load=self.link.load, fast=self.fast,
                         max_send_ahead=max(limits.max_in_flight, 1) if limits is not None else 1,
                         drafters=tuple(self.cursors))

    def _round(self) -> None:
        remaining = self.request.max_tokens - len(self.result.token_ids)
        limits = self.link.limits
        # The caps no policy may break: remaining tokens, the server's limit, the context.
        max_k = block_length(1 << 30, remaining, len(self.context),
                             max_draft_length=limits.max_draft_length if limits is not None
                             else None, max_context=self.max_context)
        if max_k is None:
            self.result.finish_reason = "length"  # no round fits the context
            return
        view = self._view(max_k)
        plan = self._gate(self.policy.plan(view))
        k = min(max(plan.k, 0), max_k)
        if not plan.verify:
            k = min(k, self.max_unverified_run - self.unverified_run)
            if k == 0:  # nothing to skip (e.g. one token left): a verified round makes progress
                plan = replace(plan, verify=True, min_confidence=0.0)
        t_start = time.monotonic() - self.t0
        pipelined = plan.verify and not self.fast  # fast mode's unverified runs go sequential
        if pipelined and plan.cloud_generate and \
                self.pipeline.cloud_round(plan.cloud_generate, t_start):
            return
        block = self.pipeline.take_ahead(k, plan) if pipelined else None
        if block is None:
            block = self._draft(k, plan)
        if not plan.verify and block.confidences and block.confidences[0] < plan.min_confidence:
            # Unsure from the first position on: nothing to skip, the verifier checks it (just
            # the plan's unsure_k first tokens of it, in fast mode).
            plan = replace(plan, verify=True)
            if plan.unsure_k is not None:
                block = block.head(plan.unsure_k, end_reason="confidence")
                k = len(block)
        if not plan.verify:
            self.force_verify = block.end_reason == "confidence"
            self._record(RoundRecord(index=0, k_asked=k, drafted=len(block), accepted=None,
                                     end_reason=block.end_reason, mode="local",
                                     cause="fast_mode", drafter=plan.drafter or "",
                                     committed=self._commit(block.tokens, verified=False,
                                                            defer_stop=True),
                                     draft_s=block.draft_s, confidences=block.confidences,
                                     entropies=block.entropies, t_start_s=t_start))
            self._check_halt()
            return
        if pipelined and (plan.draft_ahead or plan.send_ahead > 1):
            self.pipeline.run_round(block, k, plan, t_start)
        else:
            self._verify_round(block, k, plan, t_start)

    def _gate(self, plan: Plan) -> Plan:
        """The plan the loop runs: a skippable block (verify False) stays skippable only in fast
        mode, within the unverified-run bound, and not right after a skipped span that ended
        on an unsure position; otherwise it is verified like any block (so a lossless request
        is verified whatever the policy says), without the fast-mode confidence cut. The
        drafter is one of this client's local models ("" = the default). In fast mode that
        forced round drafts the plan's unsure_k tokens."""
        drafter = plan.drafter if plan.drafter in self.cursors else ""
        if plan.drafter != drafter:
            plan = replace(plan, drafter=drafter)
        if plan.verify or (self.fast and not self.force_verify
                           and self.unverified_run < self.max_unverified_run):
            return plan
        k = plan.unsure_k if self.fast and plan.unsure_k is not None else plan.k
        return replace(plan, k=min(k, plan.k), verify=True, min_confidence=0.0)

    def _draft_after(self, prefix: list[int], k: int, plan: Plan) -> Block:
        """Draft k tokens after `prefix` (a context the verdicts may still confirm)."""
        return self._draft(k, plan, context=prefix)

    def _draft(self, k: int, plan: Plan, context: list[int] | None = None) -> Block:
        cursor = self.cursors.get(plan.drafter or DEFAULT_DRAFTER, self.cursor)
        vocab = cursor.runtime.vocab_size
        max_entries = plan.q_entries or self.config.max_q_entries
        limits = self.link.limits
        if limits is not None:
            vocab = min(vocab, limits.vocab_size or vocab)
            max_entries = min(max_entries, limits.max_q_entries or max_entries)
        return cursor.draft(self.context if context is None else context, k, self.chooser,
                            vocab_size=vocab,
                                 max_entries=max_entries, stop_ids=self.request.stop_ids,
                                 min_confidence=plan.min_confidence)

    def _q_entries(self, plan: Plan) -> int:
        if self.request.sampling.greedy:
            return 0
        entries = plan.q_entries or self.config.max_q_entries
        limits = self.link.limits
        if limits is not None and limits.max_q_entries:
            entries = min(entries, limits.max_q_entries)
        return entries

    def _verify_round(self, block: Block, k: int, plan: Plan, t_start: float) -> None:
        """Get this block verified, re-opening as often as needed; commit it unverified when
        the verifier stays unreachable (or keeps evicting us, or keeps dropping the stream)."""
        record = RoundRecord(index=0, k_asked=k, drafted=len(block), accepted=None,
                             end_reason=block.end_reason, drafter=plan.drafter or "",
                             draft_s=block.draft_s, sync_s=block.sync_s,
                             sync_tokens=block.sync_tokens,
                             confidences=block.confidences,
                             entropies=block.entropies, q_entries=self._q_entries(plan),
                             attempts=0, t_start_s=t_start)
        evictions = broken = 0
        while True:
            if not self.link.is_open:
                # A second eviction in one round means the server is short of memory right
                # now: back off before asking again.
                given_up = (evictions > self.config.max_evictions_per_round
                            or broken > self.config.max_retries
                            or (broken and not self.offline_ctl.retry_now(broken))
                            or not self._open_with_retries(backoff_first=evictions > 1 or
                                                           broken > 0))
                if given_up and self._verifier_back():
                    continue  # "wait" mode: the verifier came back; the block goes to it
                if given_up:
                    record.mode, record.cause = "local", self.offline_ctl.local_cause()
                    record.committed = self._commit(block.tokens, verified=False,
                                                    defer_stop=True)
                    self._record(record)
                    self._go_offline()
                    self._check_halt()
                    return
            # Fast mode: the tokens emitted unverified since the verifier's context ride ahead
            # of the block, so its context follows without a re-open (empty when lossless).
            start = self.link.server_context
            sent = self.link.send(start, block, unverified=self.context[start:])
            record.attempts += 1
            record.bytes_up += sent.bytes_up
            record.send_s += sent.send_s
            try:
                verdict, size = self.link.await_verdict(sent, self.offline_ctl.late_s(len(block)))
            except Evicted:
                # Our state on the server is gone; the re-open carries the full context.
                evictions += 1
                self.link.drop()
                continue
            except LinkDown as error:
                broken += 1
                self.offline_ctl.failure(error)
                self.link.drop()
                continue
            except Stopped:
                self._record(record)  # sent, never answered: accepted stays None
                raise
            record.rtt_s = time.monotonic() - sent.t_sent
            record.bytes_down += size
            self._apply(record, block, verdict)
            self.offline_ctl.verdict(record.rtt_s, len(block), record.server_queue_s
                                     + record.server_forward_s + record.server_verify_s)
            return

    def _apply(self, record: RoundRecord, block: Block, verdict: pb.Verdict) -> None:
        n = verdict.accepted
        record.accepted = n
        record.verified = True
        record.target_passes = 1
        if verdict.HasField("timings"):
            record.server_queue_s = verdict.timings.queue_ms / 1000.0
            record.server_forward_s = verdict.timings.forward_ms / 1000.0
            record.server_verify_s = verdict.timings.verify_ms / 1000.0
        record.committed = self._commit(block.tokens[:n] + [int(verdict.token)], verified=True,
                                        defer_stop=True)
        self._record(record)
        self._check_halt()

    def _record(self, record: RoundRecord) -> None:
        record.index = len(self.result.rounds_log)
        self.result.rounds_log.append(record)
        self.policy.update(record)
        if self.on_round is not None:
            self.on_round(record)

    def _offline_stretch(self) -> None:
        """Generate locally up to the next probe point, then re-open if the offline policy
        says a probe is due (by time, by local tokens, or the monitor saw the verifier)."""
        remaining = self.request.max_tokens - len(self.result.token_ids)
        # The draft's cache must hold the context plus what it generates (the last one is fed
        # by the next sync).
        room = self.draft.n_ctx - len(self.context)
        if room < 1:
            self.result.finish_reason = "length"
            return
        n = min(max(self.next_probe_at - len(self.result.token_ids), 1), remaining, room)
        t_start = time.monotonic() - self.t0
        block = self._draft(n, Plan(k=n))
        self._record(RoundRecord(index=0, k_asked=n, drafted=len(block), accepted=None,
                                 end_reason=block.end_reason, mode="local",
                                 cause=self.offline_ctl.local_cause(),
                                 committed=self._commit(block.tokens, verified=False,
                                                        defer_stop=True),
                                 draft_s=block.draft_s, confidences=block.confidences,
                                 entropies=block.entropies, t_start_s=t_start))
        self._check_halt()
        self.offline_ctl.local_tokens(len(block))
        if self.result.finish_reason:
            return
        self.next_probe_at = len(self.result.token_ids) + self.config.offline_probe_tokens
        if len(self.context) >= self.max_context:
            return  # no verifier round would fit this context: stay local
        self._raise_if_misconfigured()
        if not self.offline_ctl.probe_due():
            return
        try:
            self._open_link()
        except LinkDown as error:
            self.offline_ctl.failure(error)
            return
        except VerifierRefused as refused:
            if refused.code != grpc.StatusCode.OUT_OF_RANGE:
                raise
            self.next_probe_at = self.request.max_tokens  # the context outgrew the server
            return
        self.offline_ctl.opened(self.link)
        self.offline = False

    # ---- the link -------------------------------------------------------------------------

    def _open_with_retries(self, backoff_first: bool = False) -> bool:
        """Open a stream with bounded retries, exponential backoff and jitter; False when the
        verifier stayed unreachable past the deadline (or the retries ran out)."""
        cfg = self.config
        deadline = time.monotonic() + cfg.offline_after_s
        delay = cfg.retry_initial_backoff_s
        if backoff_first:
            self._sleep(delay)
            delay = min(delay * cfg.retry_multiplier, cfg.retry_max_backoff_s)
        failures = 0
        while True:
            self._raise_if_misconfigured()
            try:
                self._open_link()
                self.offline_ctl.opened(self.link)
                return True
            except LinkDown as error:
                failures += 1
                self.offline_ctl.failure(error)
                # The monitor says the verifier is down: waiting out the retries would only
                # pause the generation (it probes, and a probe re-opens once it answers).
                if (failures > cfg.max_retries or time.monotonic() + delay > deadline
                        or not self.offline_ctl.retry_now(failures)):
                    if not cfg.offline_enabled:
                        raise CloudUnavailable(f"verifier unreachable after {failures} "
                                               f"attempts: {error}") from error
                    return False
            self._sleep(delay)
            delay = min(delay * cfg.retry_multiplier, cfg.retry_max_backoff_s)

    def _open_link(self) -> None:
        """One Open with the full context under the link's WaitRule."""
        self.link.open(self.context, self.offline_ctl.open_late_s(len(self.context)),
                       self.config.open_timeout_s)

    def _sleep(self, delay: float) -> None:
        """Backoff sleep with jitter; a stop ends it at once."""
        jitter = self.config.retry_jitter
        seconds = max(delay * (1.0 + self.jitter_rng.uniform(-jitter, jitter)), 0.0)
        if self.stop_event is not None:
            if self.stop_event.wait(seconds):
                raise _Stop()
        else:
            time.sleep(seconds)
        if self.stopped():
            raise _Stop()

    def _raise_if_misconfigured(self) -> None:
        cause = self.offline_ctl.misconfiguration()
        if cause:
            raise VerifierMisconfigured(cause)

    def _verifier_back(self) -> bool:
        """The verifier stayed unreachable: what the request's offline mode says. continue:
        False (go on locally). require_verified: raise, naming the cause. wait: pause (at most
        offline_wait_s over the whole generation) until the verifier answers again and re-open;
        True when it did, False when the wait ran out (then go on locally)."""
        self.link.drop()
        self._raise_if_misconfigured()
        ctl = self.offline_ctl
        cause = ctl.breaker.reason or "the verifier is unreachable"
        if ctl.mode is OfflineMode.REQUIRE_VERIFIED:
            raise VerifierUnavailable(f"{cause}; this request requires verified tokens "
                                      "(offline: require_verified)")
        if ctl.mode is not OfflineMode.WAIT:
            return False
        while ctl.wait_s > 0:
            started = time.monotonic()
            up = ctl.wait_for_link(ctl.wait_s, self.stopped)
            ctl.wait_s -= time.monotonic() - started
            if self.stopped():
                raise _Stop()
            if not up:
                break
            try:
                self._open_link()
            except LinkDown as error:
                ctl.failure(error)
                continue
            ctl.opened(self.link)
            return True
        ctl.wait_s = 0.0
        return False

    def _go_offline(self) -> None:
        self.link.drop()
        self.offline = True
        self.next_probe_at = len(self.result.token_ids) + self.config.offline_probe_tokens

    # ---- committing -----------------------------------------------------------------------

    def _commit(self, tokens: list[int], verified: bool, defer_stop: bool = False) -> int:
        """Append tokens to the output, cut at max_tokens and right after a stop id; tell
        on_tokens. Returns how many were committed."""
        tokens, reason = truncate(tokens, self.request.max_tokens - len(self.result.token_ids),
                                  self.request.stop_ids)
        if not tokens:
            return 0
        if not self.result.token_ids:
            self.result.ttft_s = time.monotonic() - self.t0
        self.result.token_ids.extend(tokens)
        self.result.verified.extend([verified] * len(tokens))
        self.unverified_run = 0 if verified else self.unverified_run + len(tokens)
        if verified:
            self.force_verify = False
        self.context.extend(tokens)
        self.result.finish_reason = reason
        if self.on_tokens is not None:
            if self.on_tokens(list(tokens), [verified] * len(tokens)) is False:
                self.halted = True
        if not defer_stop:
            self._check_halt()
        return len(tokens)

    def _check_halt(self) -> None:
        if self.halted and not self.result.finish_reason:
            raise _Stop()
