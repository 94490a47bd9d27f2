"""One generation: its rounds until a finish reason (vocabulary: protos/tandem/v1/decoding.proto).

One round: the caps (edge/caps.py) -> plan, k = gate.before_draft(policy.plan(view), max_k)
(edge/fast_mode.py) -> draft, or take the block drafted ahead -> gate.after_draft -> an
executor (edge/rounds/): send, await the verdict under the one WaitRule (edge/link/wait.py) ->
apply: commit the accepted prefix and the bonus token, stream them (edge/state.py) -> record:
policy.update, on_round.

The executors: sequential (one block, its verdict, re-opens), pipelined (draft-ahead,
send-ahead), cloud (the verifier generates), local (a fast-mode skip, or a stretch while the
verifier is away: tokens verified=False, rounds of mode "local"; the loop probes every few
tokens and verification resumes from the full context).

A generation stops early when the caller's stop event is set or on_tokens returns False
(finish_reason "cancelled"); a stop ends a verdict wait, an open or a backoff sleep at once
(within edge.link.STOP_POLL_S), not at the next commit.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping

from edge.caps import Caps
from edge.config import DEFAULT_DRAFTER, ClientConfig
from edge.control.policy import DraftPolicy, Plan
from edge.drafting import DraftCursor, TokenChooser
from edge.fast_calibration import FastCalibration
from edge.fast_mode import FastModeGate
from edge.link import VerifierLink
from edge.link.errors import Stopped
from edge.link.offline import OfflineControl
from edge.link.reconnect import Reconnect
from edge.record import GenerationResult
from edge.rounds.cloud import CloudRound
from edge.rounds.context import RoundContext
from edge.rounds.local import LocalRound
from edge.rounds.pipelined import PipelinedRound
from edge.rounds.sequential import SequentialRound
from edge.state import GenerationState, OnRound, OnTokens


class Generation:
    """One generation's round loop: builds its state and executors, runs rounds to the end."""

    def __init__(self, *, request, cursor: DraftCursor,
                 config: ClientConfig, policy: DraftPolicy, link: VerifierLink,
                 on_tokens: OnTokens | None = None, on_round: OnRound | None = None,
                 stop_event: threading.Event | None = None,
                 jitter_rng: random.Random | None = None,
                 cursors: Mapping[str, DraftCursor] | None = None, fast: bool = False,
                 max_unverified_run: int = 0, offline: OfflineControl | None = None,
                 calibration: FastCalibration | None = None,
                 min_agreement: float | None = None) -> None:
        """cursor: the default local model's; cursors: every local model's by ladder name;
        offline: the request's offline policy (deadlines from the measured link,
        the circuit breaker, the monitor, the offline mode); calibration, min_agreement: fast
        mode's agreement calibration and the request's target (edge/fast_mode.py)."""
        offline = offline if offline is not None else OfflineControl(config)
        cursors = dict(cursors) if cursors else {DEFAULT_DRAFTER: cursor}
        gate = FastModeGate(fast, max_unverified_run, calibration, min_agreement,
                            sampling=not request.sampling.greedy,
                            unsure_k=config.entropy.fast_unsure_k)
        self.state = state = GenerationState(request, policy, gate, on_tokens, on_round,
                                             stop_event)
        link.bind(offline.wait_rule(), state.stopped)
        self.ctx = ctx = RoundContext(
            state=state, cursors=cursors, default_cursor=cursor,
            chooser=TokenChooser(request.sampling, config.q_scale), link=link,
            caps=Caps(link, min(c.runtime.n_ctx for c in cursors.values()),
                      config.max_q_entries, config.coded_q_entries),
            offline=offline, reconnect=Reconnect(link, offline, config, stopped=state.stopped,
                                                 stop_event=stop_event, jitter_rng=jitter_rng),
            config=config)
        self.local = LocalRound(ctx)
        self.sequential = SequentialRound(ctx)
        self.pipelined = PipelinedRound(ctx, self.sequential)
        self.cloud = CloudRound(ctx)

    def run(self) -> GenerationResult:
        state, ctx, link = self.state, self.ctx, self.ctx.link
        state.t0 = time.monotonic()
        try:
            # Prefill the draft while nothing else runs, unless the policy defers it to its
            # first block (one that starts by letting the cloud generate may never draft).
            if state.policy.prefill_first:
                ctx.default_cursor.sync(state.context)
            if not ctx.reconnect.ensure_open(state.context):
                ctx.go_local()
            while not state.result.finish_reason:
                if state.stopped():
                    raise Stopped()
                if state.local:
                    self.local.stretch()
                    continue
                self._round()
        except Stopped:
            state.result.finish_reason = state.result.finish_reason or "cancelled"
            link.drop()
        finally:
            link.close("done")
            r, totals = state.result, link.totals
            r.bytes_up, r.bytes_down = totals.bytes_up, totals.bytes_down
            r.draft_bytes_up, r.drafted_tokens = totals.draft_bytes_up, totals.drafted_tokens
            r.q_encode_s = totals.q_encode_s
            r.wall_s = time.monotonic() - state.t0
            r.reopens = max(totals.opens - 1, 0)
            r.agreement = state.gate.report()
            r.moves, r.verifier = totals.moves, totals.verifier
        return state.result

    def _round(self) -> None:
        """One round, top to bottom: the caps, the policy's plan and the gate's decision before
        drafting, a cloud run if the plan asks one, else the block (drafted ahead, or now), the
        gate's decision after drafting, and the executor that sends it (or commits it)."""
        state, ctx, gate = self.state, self.ctx, self.state.gate
        max_k = ctx.caps.max_k(state.remaining, len(state.context))
        if max_k is None:
            state.result.finish_reason = "length"  # no round fits the context
            return
        view = state.view(max_k, ctx.caps, ctx.link.load, tuple(ctx.cursors), ctx.link.price,
                          ctx.link.position_cost, ctx.link.token_ms)
        plan, k = gate.before_draft(state.policy.plan(view), max_k, ctx.cursors)
        t_start = state.elapsed()
        # Every token of this request goes through the verifier (not fast mode, whose rounds
        # go sequential): only such a stream may let the cloud generate or pipeline its blocks.
        verified_stream = plan.verify and not gate.fast
        if verified_stream and plan.cloud_generate and self._cloud_round(plan, t_start):
            return
        block = self.pipelined.take_ahead(k, plan) if verified_stream else None
        if block is None:
            block = ctx.draft(k, plan)
        plan, block, k = gate.after_draft(plan, block, k)
        if not plan.verify:
            self.local.skip(block, k, plan, t_start)
        elif verified_stream and (plan.draft_ahead or plan.send_ahead > 1):
            self.pipelined.run(block, k, plan, t_start)
        else:
            self.sequential.run(block, k, plan, t_start)

    def _cloud_round(self, plan: Plan, t_start: float) -> bool:
        """Let the verifier generate the plan's cloud_generate tokens. True when the round is
        done (tokens streamed, or the generation went local because the verifier stays away);
        False when the verifier serves no Generate now: the round drafts instead."""
        opening = time.monotonic()
        if not self.cloud.ready():
            return True  # gone local: the verifier stays away
        n = self.cloud.served(plan.cloud_generate)
        if not n:
            return False
        self.pipelined.drop_ahead()
        self.cloud.run(n, t_start, open_s=time.monotonic() - opening)
        return True
