"""Pipelined rounds and the cloud-generates round of the round loop (edge/loop.py).

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

Cloud-generates: a Generate asks the verifier for n tokens of its own decoding; they stream
back one Generated message each and are committed as they come (verified: the target chose
them). A stop ends the wait at once (the stream is dropped).

A broken link or an eviction with blocks in flight drops them all and falls back to the
sequential round (which re-opens with the full context), so nothing is lost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edge.control.policy import Plan
from edge.drafting import Block
from edge.link import Evicted, Sent, Stopped
from edge.rounds import RoundRecord
from edge.session_stream import LinkDown, ProtocolError

if TYPE_CHECKING:
    from edge.loop import Generation


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


class Pipeline:
    def __init__(self, gen: "Generation") -> None:
        self.gen = gen
        self.ahead: _Ahead | None = None

    # ---- draft-ahead ------------------------------------------------------------------------

    def take_ahead(self, k: int, plan: Plan) -> Block | None:
        """The block drafted ahead for this context, cut or extended to k; None if there is
        none (or it was built on a prefix the verdict rejected)."""
        ahead, self.ahead = self.ahead, None
        gen = self.gen
        if ahead is None or ahead.start != len(gen.context) or k == 0:
            return None
        block = ahead.block.head(k)
        if len(block) < k and block.end_reason == "length":
            more = gen._draft_after(gen.context + block.tokens, k - len(block), plan)
            block = replace(block, tokens=block.tokens + more.tokens, q=block.q + more.q,
                            confidences=block.confidences + more.confidences,
                            entropies=block.entropies + more.entropies,
                            end_reason=more.end_reason, draft_s=block.draft_s + more.draft_s)
        return block

    def window(self, plan: Plan) -> int:
        limits = self.gen.link.limits
        server = limits.max_in_flight if limits is not None and limits.max_in_flight else 1
        return max(1, min(plan.send_ahead, server))

    # ---- a pipelined round ------------------------------------------------------------------

    def run_round(self, block: Block, k: int, plan: Plan, t_start: float) -> None:
        gen = self.gen
        if not gen.link.is_open:  # re-opening and its fallbacks live in the sequential round
            gen._verify_round(block, k, plan, t_start)
            return
        w = self.window(plan)
        chain = [self._send(block, k, plan, t_start, len(gen.context), None, 1)]
        # Draft ahead (and send ahead while the window allows) on the assumption that every
        # block in flight is accepted whole.
        prefix = gen.context + block.tokens
        while True:
            last = chain[-1]
            if last.block.end_reason == "stop_id":
                break
            next_k = self._next_length(k, prefix, chain)
            if next_k is None:
                break
            t_ahead = time.monotonic() - gen.t0
            drafted = gen._draft_after(prefix, next_k + 1, plan)
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
        further block fits (max_tokens, the server's context, the draft's cache)."""
        gen = self.gen
        committed = len(gen.result.token_ids) + sum(len(e.block) + 1 for e in chain)
        remaining = gen.request.max_tokens - committed
        room = min(gen.max_context, gen.draft.n_ctx) - (len(prefix) + 1)
        limits = gen.link.limits
        n = min(k, remaining - 1, room - 1)
        if limits is not None and limits.max_draft_length:
            n = min(n, limits.max_draft_length)
        return n if n >= 1 else None

    def _send(self, block: Block, k: int, plan: Plan, t_start: float, start: int,
              assumed: int | None, in_flight: int) -> _InFlight:
        gen = self.gen
        sent = gen.link.send(start, block, ahead=assumed is not None,
                             assumed_token=assumed or 0, in_flight=in_flight)
        record = RoundRecord(index=0, k_asked=k, drafted=len(block), accepted=None,
                             end_reason=block.end_reason, drafter=plan.drafter or "",
                             draft_s=block.draft_s, sync_s=block.sync_s,
                             sync_tokens=block.sync_tokens,
                             confidences=block.confidences,
                             entropies=block.entropies, q_entries=gen._q_entries(plan),
                             bytes_up=sent.bytes_up, send_s=sent.send_s, in_flight=in_flight,
                             t_start_s=t_start)
        return _InFlight(block=block, sent=sent, record=record)

    def _settle(self, chain: list[_InFlight], plan: Plan) -> None:
        """Await the verdicts in order and apply them; blocks after a partial accept (or a wrong
        guess) come back discarded."""
        gen = self.gen
        alive = True
        for i, entry in enumerate(chain):
            try:
                verdict, size = gen.link.await_verdict(
                    entry.sent, gen.offline_ctl.late_s(len(entry.block)), allow_discarded=True)
            except (Evicted, LinkDown):
                gen.link.drop()
                self.ahead = None
                if alive:  # redo this block the sequential way (re-open, retries, fallback)
                    gen._verify_round(entry.block, entry.record.k_asked, plan,
                                      entry.record.t_start_s)
                return
            except Stopped:
                gen._record(entry.record)
                raise
            entry.record.rtt_s = time.monotonic() - entry.sent.t_sent
            entry.record.bytes_down = size
            if verdict.discarded:
                if alive:
                    raise ProtocolError(f"round {entry.sent.round}: a block on the verified "
                                        "context was answered as discarded")
                entry.record.mode = "discarded"
                gen._record(entry.record)
                continue
            if not alive:
                raise ProtocolError(f"round {entry.sent.round}: a block built on a rejected "
                                    "prefix was verified")
            gen._apply(entry.record, entry.block, verdict)
            record = entry.record
            gen.offline_ctl.verdict(record.rtt_s, len(entry.block), record.server_queue_s
                                    + record.server_forward_s + record.server_verify_s)
            if gen.result.finish_reason:
                self.ahead = None
                return  # max_tokens or a stop id: later blocks do not matter
            full = verdict.accepted == len(entry.block) and entry.guess is not None \
                and int(verdict.token) == entry.guess
            if not full:
                alive = False
                self.ahead = None

    # ---- cloud-generates --------------------------------------------------------------------

    def cloud_round(self, n: int, t_start: float) -> bool:
        """Ask the verifier for n tokens; False when it does not serve Generate (the caller
        then runs an ordinary round)."""
        gen = self.gen
        limits = gen.link.limits
        if not gen.link.is_open or limits is None or not limits.max_generate_tokens:
            return False
        n = min(n, limits.max_generate_tokens, gen.request.max_tokens - len(gen.result.token_ids),
                gen.max_context - len(gen.context))
        if n < 1:
            return False
        self.ahead = None
        sent = gen.link.send_generate(len(gen.context), n, sorted(gen.request.stop_ids))
        record = RoundRecord(index=0, k_asked=0, drafted=0, accepted=None, end_reason="zero",
                             mode="cloud", verified=True, bytes_up=sent.bytes_up,
                             send_s=sent.send_s, attempts=1, t_start_s=t_start)
        finished = False
        try:
            while True:
                generated, size = gen.link.await_generated(sent, gen.offline_ctl.late_s(1))
                if record.rtt_s == 0.0:
                    record.rtt_s = time.monotonic() - sent.t_sent  # to the first token
                record.bytes_down += size
                record.target_passes += 1
                record.server_queue_s += generated.timings.queue_ms / 1000.0
                record.server_forward_s += generated.timings.forward_ms / 1000.0
                record.committed += gen._commit([int(generated.token)], verified=True,
                                                defer_stop=True)
                finished = generated.done
                if finished or gen.result.finish_reason or gen.halted:
                    break
        except (Evicted, LinkDown):
            gen.link.drop()  # the next round re-opens with the full context
        finally:
            gen._record(record)
        if not finished and gen.link.is_open:
            gen.link.drop()  # stopped early: the verifier may still be generating
        gen._check_halt()
        return True
