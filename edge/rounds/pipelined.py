"""The pipelined round: draft-ahead and send-ahead on top of the sequential round.

Draft-ahead: once a block is sent, the draft goes on as if the verifier will accept all of it:
it drafts its guess g of the bonus token and the next block after it. When the verdict accepts
the whole block and its bonus token is g, the next block is ready at once; otherwise it is
dropped (the next sync rolls the draft back). Tokens never skip verification, so greedy output
stays the target's, and sampling stays exact: each drafted token is still a sample from the q
sent with it, drawn by the edge's own RNG independently of the verifier's.

Send-ahead (W > 1 blocks in flight, when the verifier's Limits.max_in_flight allows): the next
block is also sent at once, marked `ahead` with `assumed_token` = g and start = the context
length a full accept gives. The verifier takes blocks in order and answers one built on a
prefix it rejected as discarded without scoring it (protos/tandem/v1/decoding.proto). This
hides a round trip on every fully accepted round at the cost of the discarded blocks' bytes.

A broken link or an eviction with blocks in flight drops them all and falls back to the
sequential round (which re-opens with the full context), so nothing is lost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from edge.control.policy import Plan
from edge.drafting import Block
from edge.link import Sent
from edge.link.errors import Evicted, LinkDown, ProtocolError, Stopped
from edge.record import RoundRecord, block_record
from edge.rounds.context import RoundContext
from edge.rounds.sequential import SequentialRound


@dataclass
class _Ahead:
    start: int      # the context length this block follows (after the guessed bonus token)
    block: Block


@dataclass
class _InFlight:
    block: Block
    sent: Sent
    record: RoundRecord
    guess: int | None = None  # the bonus token the next block assumes


class PipelinedRound:
    def __init__(self, ctx: RoundContext, sequential: SequentialRound) -> None:
        self.ctx = ctx
        self.sequential = sequential  # re-opening and its fallbacks
        self.ahead: _Ahead | None = None

    # ---- draft-ahead ------------------------------------------------------------------------

    def take_ahead(self, k: int, plan: Plan) -> Block | None:
        """The block drafted ahead for this context, cut or extended to k; None if there is
        none (or it was built on a prefix the verdict rejected)."""
        ahead, self.ahead = self.ahead, None
        context = self.ctx.state.context
        if ahead is None or ahead.start != len(context) or k == 0:
            return None
        block = ahead.block.head(k)
        if len(block) < k and block.end_reason == "length":
            more = self.ctx.draft(k - len(block), plan, context=context + block.tokens)
            block = replace(block, tokens=block.tokens + more.tokens, q=block.q + more.q,
                            confidences=block.confidences + more.confidences,
                            entropies=block.entropies + more.entropies,
                            end_reason=more.end_reason, draft_s=block.draft_s + more.draft_s)
        return block

    def drop_ahead(self) -> None:
        """The context moved another way (cloud-generates): the block drafted ahead is stale."""
        self.ahead = None

    # ---- a pipelined round ------------------------------------------------------------------

    def run(self, block: Block, k: int, plan: Plan, t_start: float) -> None:
        ctx = self.ctx
        if not ctx.link.is_open:  # re-opening and its fallbacks live in the sequential round
            self.sequential.run(block, k, plan, t_start)
            return
        w = ctx.caps.window(plan.send_ahead)
        chain = [self._send(block, k, plan, t_start, len(ctx.state.context), None, 1)]
        # Draft ahead (and send ahead while the window allows) on the assumption that every
        # block in flight is accepted whole.
        prefix = ctx.state.context + block.tokens
        while True:
            last = chain[-1]
            if last.block.end_reason == "stop_id":
                break
            next_k = self._next_length(k, prefix, chain)
            if next_k is None:
                break
            t_ahead = ctx.state.elapsed()
            drafted = ctx.draft(next_k + 1, plan, context=prefix)
            if not drafted.tokens:
                break
            last.guess = drafted.tokens[0]
            following = drafted.tail(1)
            start = len(prefix) + 1
            if len(chain) < w and len(following) > 0:
                chain.append(self._send(following, next_k, plan, t_ahead, start, last.guess,
                                        len(chain) + 1))
                prefix = prefix + [last.guess] + following.tokens
                continue
            self.ahead = _Ahead(start=start, block=following)
            break
        self._settle(chain, plan)

    def _next_length(self, k: int, prefix: list[int], chain: list[_InFlight]) -> int | None:
        """The next block's length if every block in flight is accepted whole, or None when no
        further block fits (max_tokens, the caps: the verifier's draft length and context, every
        local model's cache)."""
        remaining = self.ctx.state.remaining - sum(len(e.block) + 1 for e in chain)
        if remaining < 2:
            return None
        n = self.ctx.caps.max_k(remaining, len(prefix) + 1, k)
        return n or None

    def _send(self, block: Block, k: int, plan: Plan, t_start: float, start: int,
              assumed: int | None, in_flight: int) -> _InFlight:
        ctx = self.ctx
        sent = ctx.link.send(start, block, ahead=assumed is not None,
                             assumed_token=assumed or 0, in_flight=in_flight)
        record = block_record(block, k, t_start, drafter=plan.drafter or "",
                              q_entries=ctx.q_entries(plan), bytes_up=sent.bytes_up,
                              send_s=sent.send_s, in_flight=in_flight)
        return _InFlight(block=block, sent=sent, record=record)

    def _settle(self, chain: list[_InFlight], plan: Plan) -> None:
        """Await the verdicts in order and apply them; blocks after a partial accept (or a wrong
        guess) come back discarded."""
        ctx, state = self.ctx, self.ctx.state
        alive = True
        for entry in chain:
            try:
                verdict, size = ctx.await_verdict(entry.sent, allow_discarded=True)
            except (Evicted, LinkDown):
                ctx.link.drop()
                self.ahead = None
                if alive:  # redo this block the sequential way (re-open, retries, fallback)
                    self.sequential.run(entry.block, entry.record.k_asked, plan,
                                        entry.record.t_start_s)
                return
            except Stopped:
                state.record(entry.record)
                raise
            entry.record.rtt_s = time.monotonic() - entry.sent.t_sent
            entry.record.bytes_down = size
            if verdict.discarded:
                if alive:
                    raise ProtocolError(f"round {entry.sent.round}: a block on the verified "
                                        "context was answered as discarded")
                entry.record.mode = "discarded"
                state.record(entry.record)
                continue
            if not alive:
                raise ProtocolError(f"round {entry.sent.round}: a block built on a rejected "
                                    "prefix was verified")
            state.apply(entry.record, entry.block, verdict)
            ctx.verdict_seen(entry.record)
            if state.result.finish_reason:
                self.ahead = None
                return  # max_tokens or a stop id: later blocks do not matter
            full = verdict.accepted == len(entry.block) and entry.guess is not None \
                and int(verdict.token) == entry.guess
            if not full:
                alive = False
                self.ahead = None
