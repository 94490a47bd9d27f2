"""The state of one generation: its context (prompt + every committed token), its result, and
the three ways a round ends in it: commit tokens, apply a verdict, record the round.

A generation stops early when the caller's stop event is set or on_tokens returns False
(finish_reason "cancelled"): `check_halt` raises Stopped after the round that saw it is
recorded, and the link's waits poll `stopped`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edge.caps import Caps
from edge.control.policy import DraftPolicy, RoundView, TokenMs
from edge.drafting import Block
from edge.fast_mode import FastModeGate
from edge.link.errors import Stopped
from edge.link_state import LinkState
from edge.record import GenerationResult, RoundRecord
from edge.request import GenerationRequest
from tandem.v1 import decoding_pb2 as pb

# on_tokens(ids, verified) -> False stops the generation (None or True go on).
OnTokens = Callable[[list[int], list[bool]], "bool | None"]
OnRound = Callable[[RoundRecord], None]


def truncate(tokens: list[int], room: int, stop_ids: frozenset[int]) -> tuple[list[int], str]:
    """Cut tokens to at most `room` and right after the first stop id; return them and the
    finish reason they cause ("stop", "length", or "" to go on)."""
    for i, token in enumerate(tokens[:room]):
        if token in stop_ids:
            return tokens[: i + 1], "stop"
    tokens = tokens[:room]
    return tokens, ("length" if len(tokens) >= room else "")


class GenerationState:
    def __init__(self, request: GenerationRequest, policy: DraftPolicy, gate: FastModeGate,
                 on_tokens: OnTokens | None = None, on_round: OnRound | None = None,
                 stop_event: threading.Event | None = None) -> None:
        self.request = request
        self.policy = policy
        self.gate = gate
        self.on_tokens = on_tokens
        self.on_round = on_round
        self.stop_event = stop_event
        self.context = [int(t) for t in request.prompt_ids]
        self.result = GenerationResult()
        self.halted = False          # on_tokens returned False
        self.local = False           # generating without the verifier until a probe re-opens
        self.next_probe_at = 0       # while local: probe once this many tokens are committed
        self.t0 = 0.0

    def stopped(self) -> bool:
        return self.halted or (self.stop_event is not None and self.stop_event.is_set())

    @property
    def generated(self) -> int:
        return len(self.result.token_ids)

    @property
    def remaining(self) -> int:
        return self.request.max_tokens - self.generated

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def view(self, max_k: int, caps: Caps, server_load: float,
             drafters: tuple[str, ...], price: float = 0.0,
             position_cost: float | None = None,
             token_ms: TokenMs = (None, None)) -> RoundView:
        """What the policy sees before a round (price, position_cost: the verifier's, as the
        link last heard them)."""
        return RoundView(round=len(self.result.rounds_log), generated=self.generated,
                         remaining=self.remaining, max_k=max_k,
                         link_state=LinkState.DOWN if self.local else LinkState.UP,
                         sampling=not self.request.sampling.greedy,
                         history=self.result.rounds_log, context_length=len(self.context),
                         max_q_entries=caps.q_entries_cap(), server_load=server_load,
                         fast=self.gate.fast, max_send_ahead=caps.window(), drafters=drafters,
                         price=price, position_cost=position_cost, token_ms=token_ms,
                         min_tokens_per_s=self.request.min_tokens_per_s)

    # ---- the end of a round ---------------------------------------------------------------

    def commit(self, tokens: list[int], verified: bool) -> int:
        """Append tokens to the output, cut at max_tokens and right after a stop id; tell
        on_tokens. Returns how many were committed. A stop takes effect at check_halt."""
        tokens, reason = truncate(tokens, self.remaining, self.request.stop_ids)
        if not tokens:
            return 0
        if not self.result.token_ids:
            self.result.ttft_s = self.elapsed()
        self.result.token_ids.extend(tokens)
        self.result.verified.extend([verified] * len(tokens))
        self.gate.committed(len(tokens), verified)
        self.context.extend(tokens)
        self.result.finish_reason = reason
        if self.on_tokens is not None:
            if self.on_tokens(list(tokens), [verified] * len(tokens)) is False:
                self.halted = True
        return len(tokens)

    def apply(self, record: RoundRecord, block: Block, verdict: pb.Verdict) -> None:
        """A verdict: commit the accepted prefix and the bonus token, record the round."""
        n = verdict.accepted
        record.accepted = n
        record.verified = True
        record.target_passes = 1
        if verdict.HasField("timings"):
            record.server_queue_s = verdict.timings.queue_ms / 1000.0
            record.server_forward_s = verdict.timings.forward_ms / 1000.0
            record.server_verify_s = verdict.timings.verify_ms / 1000.0
        record.committed = self.commit(block.tokens[:n] + [int(verdict.token)], verified=True)
        self.record(record)
        self.check_halt()

    def apply_unverified(self, record: RoundRecord, block: Block, cause: str) -> None:
        """No verdict: commit the block as it is (a local round), record the round."""
        record.mode, record.cause = "local", cause
        record.committed = self.commit(block.tokens, verified=False)
        self.record(record)
        self.check_halt()

    def record(self, record: RoundRecord) -> None:
        """The round's one record: to the log, the policy and on_round."""
        record.index = len(self.result.rounds_log)
        self.result.rounds_log.append(record)
        self.gate.observe(record)  # checked tokens feed fast mode's calibration
        self.policy.update(record)
        if self.on_round is not None:
            self.on_round(record)

    def check_halt(self) -> None:
        if self.halted and not self.result.finish_reason:
            raise Stopped()
