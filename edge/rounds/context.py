"""What every round executor gets: one RoundContext (the generation's state, its local models,
the link, the caps, the offline policy and the reconnect logic)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edge.caps import Caps
from edge.config import DEFAULT_DRAFTER, ClientConfig
from edge.control.policy import Plan
from edge.drafting import Block, DraftCursor, TokenChooser
from edge.link import Sent, VerifierLink
from edge.link.offline import OfflineControl
from edge.link.reconnect import Reconnect
from edge.record import RoundRecord
from edge.state import GenerationState
from tandem.v1 import decoding_pb2 as pb


@dataclass
class RoundContext:
    state: GenerationState
    cursors: Mapping[str, DraftCursor]  # the local models by ladder name, DEFAULT_DRAFTER first
    default_cursor: DraftCursor         # DEFAULT_DRAFTER's: drafts the local stretches
    chooser: TokenChooser
    link: VerifierLink
    caps: Caps
    offline: OfflineControl             # deadlines, circuit breaker, the request's offline mode
    reconnect: Reconnect
    config: ClientConfig

    def draft(self, k: int, plan: Plan, context: Sequence[int] | None = None) -> Block:
        """Draft k tokens with the plan's local model after `context` (default: the
        generation's context; a pipelined round drafts after a prefix the verdicts may still
        confirm)."""
        cursor = self.cursors.get(plan.drafter or DEFAULT_DRAFTER, self.default_cursor)
        self.chooser.codec = self.link.q_codec  # the quantizer of the q format negotiated
        return cursor.draft(self.state.context if context is None else context, k, self.chooser,
                            vocab_size=self.caps.vocab(cursor.runtime.vocab_size),
                            max_entries=self.caps.q_entries_cap(plan.q_entries),
                            stop_ids=self.state.request.stop_ids,
                            min_confidence=plan.min_confidence)

    def q_entries(self, plan: Plan) -> int:
        """Sparse-q entries per position the round's block carries, as its RoundRecord reports
        them (0 = greedy); the cap they come from is Caps.q_entries_cap."""
        return 0 if self.state.request.sampling.greedy else self.caps.q_entries_cap(plan.q_entries)

    def await_verdict(self, sent: Sent, allow_discarded: bool = False) -> tuple[pb.Verdict, int]:
        """The verdict of `sent` under the WaitRule: late after the offline policy's late_s."""
        return self.link.await_verdict(sent, self.offline.late_s(sent.k), allow_discarded)

    def verdict_seen(self, record: RoundRecord) -> None:
        """A verdict came: the offline policy learns the round trip (and closes its breaker)."""
        self.offline.verdict(record.rtt_s, record.drafted, record.server_queue_s
                             + record.server_forward_s + record.server_verify_s)

    def go_local(self) -> None:
        """Generate without the verifier until a probe re-opens (edge/rounds/local.py)."""
        self.link.drop()
        self.state.local = True
        self.state.next_probe_at = self.state.generated + self.config.offline_probe_tokens
