"""The sequential round: send one block, await its verdict under the WaitRule, apply it.

Server state is soft. On Evicted, or a broken link, the round re-opens with the full context
and sends the block again, losing nothing. If the verifier stays unreachable (or keeps evicting
us, or keeps dropping the stream), the request's offline mode decides: wait for it, fail, or
commit the block unverified and go local (edge/rounds/local.py).
"""
from __future__ import annotations

import time

from edge.control.policy import Plan
from edge.drafting import Block
from edge.link.errors import Evicted, LinkDown, Stopped
from edge.record import block_record
from edge.rounds.context import RoundContext


class SequentialRound:
    def __init__(self, ctx: RoundContext) -> None:
        self.ctx = ctx

    def run(self, block: Block, k: int, plan: Plan, t_start: float) -> None:
        ctx = self.ctx
        record = block_record(block, k, t_start, drafter=plan.drafter or "",
                              q_entries=ctx.q_entries(plan), attempts=0)
        evictions = broken = 0
        while True:
            if not ctx.link.is_open:
                opening = time.monotonic()
                reopened = self._reopen(evictions, broken)
                record.open_s += time.monotonic() - opening
                if not reopened:
                    ctx.state.apply_unverified(record, block, cause=ctx.offline.local_cause())
                    ctx.go_local()
                    return
            # Fast mode: the tokens emitted unverified since the verifier's context ride ahead
            # of the block, so its context follows without a re-open (empty when lossless).
            start = ctx.link.server_context
            sent = ctx.link.send(start, block, unverified=ctx.state.context[start:])
            record.attempts += 1
            record.bytes_up += sent.bytes_up
            record.send_s += sent.send_s
            try:
                verdict, size = ctx.await_verdict(sent)
            except Evicted:
                # Our state on the server is gone; the re-open carries the full context.
                evictions += 1
                ctx.link.drop()
                continue
            except LinkDown as error:
                broken += 1
                ctx.offline.failure(error)
                ctx.link.drop()
                continue
            except Stopped:
                ctx.state.record(record)  # sent, never answered: accepted stays None
                raise
            record.rtt_s = time.monotonic() - sent.t_sent
            record.bytes_down += size
            ctx.state.apply(record, block, verdict)
            ctx.verdict_seen(record)
            return

    def _reopen(self, evictions: int, broken: int) -> bool:
        """Re-open for this round; False when the verifier is given up on (the block then goes
        unverified). A second eviction in one round means the server is short of memory right
        now: back off before asking again."""
        ctx = self.ctx
        cfg, context = ctx.config, ctx.state.context
        if (evictions > cfg.max_evictions_per_round or broken > cfg.max_retries
                or (broken and not ctx.offline.retry_now(broken))):
            return ctx.reconnect.reopen_if_waiting(context)  # no more tries for this round
        return ctx.reconnect.ensure_open(context, backoff_first=evictions > 1 or broken > 0)
