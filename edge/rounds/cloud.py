"""The cloud-generates round: a Generate asks the verifier for n tokens of its own decoding;
they stream back one Generated message each and are committed as they come (verified: the
target chose them). A stop ends the wait at once (the stream is dropped)."""
from __future__ import annotations

import time

from edge.drafting import Block
from edge.link.errors import Evicted, LinkDown
from edge.record import block_record
from edge.rounds.context import RoundContext


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

    def ready(self) -> bool:
        """Whether the link is open for a Generate, re-opened with the full context when it was
        dropped; False, with the generation gone local, when the verifier stays unreachable (the
        request's offline mode said so: edge/link/reconnect.py)."""
        ctx = self.ctx
        if ctx.link.is_open:
            return True
        context = ctx.state.context
        if ctx.reconnect.ensure_open(context):
            return True
        ctx.go_local()
        return False

    def run(self, n: int, t_start: float, open_s: float = 0.0) -> None:
        """Ask the verifier for n tokens (n = served(...) >= 1) and commit them as they come
        (open_s: what ready() spent re-opening the link)."""
        ctx, state = self.ctx, self.ctx.state
        sent = ctx.link.send_generate(len(state.context), n, sorted(state.request.stop_ids))
        record = block_record(Block(end_reason="zero"), 0, t_start, mode="cloud", verified=True,
                              bytes_up=sent.bytes_up, send_s=sent.send_s, open_s=open_s)
        finished = False
        last = sent.t_sent  # the last token's arrival
        try:
            while True:
                generated, size = ctx.link.await_generated(sent, ctx.offline.late_s(1))
                now = time.monotonic()
                if record.rtt_s == 0.0:
                    record.rtt_s = now - sent.t_sent  # to the first token
                else:
                    record.gaps_s.append(now - last)
                last = now
                record.bytes_down += size
                record.target_passes += 1
                record.server_queue_s += generated.timings.queue_ms / 1000.0
                record.server_forward_s += generated.timings.forward_ms / 1000.0
                record.committed += state.commit([int(generated.token)], verified=True)
                finished = generated.done
                if finished or state.result.finish_reason or state.halted:
                    break
        except Evicted:
            record.cut = True
            ctx.link.drop()  # the next round re-opens with the full context
        except LinkDown as error:
            record.cut = True
            ctx.offline.failure(error)
            ctx.link.drop()
        finally:
            state.record(record)
        if not finished and ctx.link.is_open:
            ctx.link.drop()  # stopped early: the verifier may still be generating
        state.check_halt()
