"""The caps no policy may break, and the only reader of the verifier's limits (`Limits`, sent in
Opened: protos/tandem/v1/decoding.proto).

What 0 means, one meaning per field, as the proto's comments on Limits say:
  max_draft_length     0 = no drafts: only k = 0 blocks (the verdict's token alone); the
                       verifier refuses any block longer than its limit (cloud/convert.py
                       check_draft_sizes on the wire, cloud/engine.py _check_draft)
  max_in_flight        0 or 1 = no send-ahead
  max_generate_tokens  0 = Generate not served
  max_context, max_q_entries
                       0 = no limit set: the edge's own bound applies
  vocab_size           0 = not said: the draft's own vocabulary, token ids unchecked
No Limits at all (before the first Opened): no bound of the verifier's.
"""
from __future__ import annotations

from typing import Protocol

from tandem.v1 import decoding_pb2 as pb

NO_LIMIT = 1 << 30  # a draft length no cap reaches


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


def verifier_vocab(limits: pb.Limits | None) -> int:
    """The verifier's vocabulary size; 0 = not reported (token ids go unchecked)."""
    return limits.vocab_size if limits is not None else 0


class HasLimits(Protocol):
    limits: pb.Limits | None   # the last Opened's (edge.link.VerifierLink)
    q_codec: object | None     # the coded-q format the open stream negotiated (None: plain)


class Caps:
    """The verifier's limits (read live from the link: a re-open may bring new ones) combined
    with the edge's own bounds: the smallest cache among the local models (n_ctx) and
    client.max_q_entries (client.coded_q_entries when the session codes q)."""

    def __init__(self, link: HasLimits, n_ctx: int, max_q_entries: int,
                 coded_q_entries: int | None = None) -> None:
        self.link = link
        self.n_ctx = n_ctx
        self.max_q_entries = max_q_entries
        self.coded_q_entries = coded_q_entries if coded_q_entries is not None else max_q_entries

    def _limit(self, field: str) -> int:
        limits = self.link.limits
        return getattr(limits, field) if limits is not None else 0

    @property
    def max_draft_length(self) -> int | None:
        """None = no limit (no Limits yet); 0 = no drafts."""
        return self.link.limits.max_draft_length if self.link.limits is not None else None

    @property
    def max_context(self) -> int:
        """The longest context both sides can hold: the verifier's and every local model's."""
        server = self._limit("max_context")
        return min(server, self.n_ctx) if server else self.n_ctx

    def max_k(self, remaining: int, context_length: int, k: int = NO_LIMIT) -> int | None:
        """k capped by the tokens left, the verifier's draft length and the context room;
        None when no round fits the context."""
        return block_length(k, remaining, context_length, max_draft_length=self.max_draft_length,
                            max_context=self.max_context)

    def q_entries_cap(self, asked: int | None = None) -> int:
        """The most sparse-q entries a drafted position may carry: the plan's, else the config's
        (the coded q's own cap, client.coded_q_entries, when the session codes q and the plan
        did not lower it), within the verifier's limit. (What a round asked is
        RoundRecord.q_entries: 0 when greedy.)"""
        entries = asked or self.max_q_entries
        if self.link.q_codec is not None and entries >= self.max_q_entries:
            entries = self.coded_q_entries
        server = self._limit("max_q_entries")
        return min(entries, server) if server else entries

    def vocab(self, own: int) -> int:
        """The ids a draft may propose: its own vocabulary within the verifier's."""
        server = self._limit("vocab_size")
        return min(own, server) if server else own

    def window(self, send_ahead: int = NO_LIMIT) -> int:
        """Blocks in flight at once: the plan's send_ahead within the verifier's (>= 1)."""
        return max(1, min(send_ahead, self._limit("max_in_flight") or 1))

    @property
    def generate_tokens(self) -> int:
        """Most tokens one Generate may ask for; 0 = the verifier does not serve Generate."""
        return self._limit("max_generate_tokens")
