"""The cloud-generates round: a Generate asks the verifier for n tokens of its own decoding;
they stream back one Generated message each and are committed as they come (verified: the
target chose them). A stop ends the wait at once (the stream is dropped)."""
from __future__ import annotations

import time

from edge.drafting import Block
from edge.link import Evicted
from edge.link.stream import LinkDown
from edge.rounds.context import RoundContext
from edge.rounds.record import block_record


class CloudRound:
    def __init__(self, ctx: RoundContext) -> None:
        self.ctx = ctx

    def served(self, n: int) -> int:
        """How many tokens one Generate may ask now (0: the verifier does not serve Generate,
        the link is not open, or no token fits)."""
        ctx, state = self.ctx, self.ctx.state
        if not ctx.link.is_open or not ctx.caps.generate_tokens:
            return 0
        return max(min(n, ctx.caps.generate_tokens, state.remaining,
                       ctx.caps.max_context - len(state.context)), 0)

    def run(self, n: int, t_start: float) -> None:
        """Ask the verifier for n tokens (n = served(...) >= 1) and commit them as they come."""
        ctx, state = self.ctx, self.ctx.state
        sent = ctx.link.send_generate(len(state.context), n, sorted(state.request.stop_ids))
        record = block_record(Block(end_reason="zero"), 0, t_start, mode="cloud", verified=True,
                              bytes_up=sent.bytes_up, send_s=sent.send_s)
        finished = False
        try:
            while True:
                generated, size = ctx.link.await_generated(sent, ctx.offline.late_s(1))
                if record.rtt_s == 0.0:
                    record.rtt_s = time.monotonic() - sent.t_sent  # to the first token
                record.bytes_down += size
                record.target_passes += 1
                record.server_queue_s += generated.timings.queue_ms / 1000.0
                record.server_forward_s += generated.timings.forward_ms / 1000.0
                record.committed += state.commit([int(generated.token)], verified=True)
                finished = generated.done
                if finished or state.result.finish_reason or state.halted:
                    break
        except (Evicted, LinkDown):
            ctx.link.drop()  # the next round re-opens with the full context
        finally:
            state.record(record)
        if not finished and ctx.link.is_open:
            ctx.link.drop()  # stopped early: the verifier may still be generating
        state.check_halt()
