"""Local rounds: tokens committed without the verifier (verified=False, mode "local", with the
cause in RoundRecord.cause: edge/link/offline.py UNVERIFIED_CAUSES).

- A fast-mode skip: a block the gate let go unverified (cause "fast_mode").
- A local stretch, while the verifier is away: the draft generates up to the next probe point
  alone, then the loop re-opens if the offline policy says a probe is due (by time, by local
  tokens, or the monitor saw the verifier); verification resumes from the full context.
"""
from __future__ import annotations

import grpc

from edge.control.policy import Plan
from edge.drafting import Block
from edge.link.errors import LinkDown, VerifierRefused
from edge.record import block_record
from edge.rounds.context import RoundContext


class LocalRound:
    def __init__(self, ctx: RoundContext) -> None:
        self.ctx = ctx

    def skip(self, block: Block, k: int, plan: Plan, t_start: float) -> None:
        """Commit a block the fast-mode gate let skip verification."""
        state = self.ctx.state
        state.gate.skipped(block)
        state.apply_unverified(block_record(block, k, t_start, drafter=plan.drafter or ""),
                               block, cause="fast_mode")

    def stretch(self) -> None:
        """Generate locally up to the next probe point, then probe (re-open) if one is due."""
        ctx, state = self.ctx, self.ctx.state
        # The draft's cache must hold the context plus what it generates (the last one is fed
        # by the next sync).
        room = ctx.default_cursor.runtime.n_ctx - len(state.context)
        if room < 1:
            state.result.finish_reason = "length"
            return
        n = min(max(state.next_probe_at - state.generated, 1), state.remaining, room)
        t_start = state.elapsed()
        block = ctx.draft(n, Plan(k=n))
        state.apply_unverified(block_record(block, n, t_start), block,
                               cause=ctx.offline.local_cause())
        ctx.offline.local_tokens(len(block))
        if state.result.finish_reason:
            return
        state.next_probe_at = state.generated + ctx.config.offline_probe_tokens
        if len(state.context) >= ctx.caps.max_context:
            return  # no verifier round would fit this context: stay local
        self._probe()

    def _probe(self) -> None:
        ctx, state = self.ctx, self.ctx.state
        ctx.reconnect.check_configured()
        if not ctx.offline.probe_due():
            return
        try:
            ctx.reconnect.open(state.context)
        except LinkDown as error:
            ctx.offline.failure(error)
            return
        except VerifierRefused as refused:
            if refused.code != grpc.StatusCode.OUT_OF_RANGE:
                raise
            state.next_probe_at = state.request.max_tokens  # the context outgrew the server
            return
        ctx.offline.opened(ctx.link)
        state.local = False
