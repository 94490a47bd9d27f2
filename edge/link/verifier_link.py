"""`VerifierLink`, one generation's session with the verifier (open, send a block without
waiting, await its verdict, byte counting, error classes); every wait goes by the WaitRule
(edge/link/wait.py). The messages it builds and checks are plain functions below the class.

Error classes the round loop tells apart:
  (all in edge/link/errors.py)
  LinkDown                        outage: the stream broke or timed out -> reconnect / offline
  Evicted                         overload: the server dropped our state -> re-open
  VerifierRefused                 configuration / identity (bad key, fingerprint, request):
                                  retrying cannot help -> raised to the caller
  Stopped                         the caller stopped the generation while the link waited
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from edge.caps import verifier_vocab
from edge.link.channel import SESSION_HEADER
from edge.link.errors import (Evicted, IdentityMismatch, LinkDown, ProtocolError,
                              VerifierMisconfigured, check_identity)
from edge.link.stream import SessionStream
from edge.link.wait import WaitRule
from tandem.codec import InvalidDistribution, to_proto
from tandem.qcodec import QCodec
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from edge.control.policy import TokenMs
    from edge.drafting import Block


log = logging.getLogger(__name__)


@dataclass
class LinkTotals:
    """What one generation's link sent and received, over every stream it held."""
    bytes_up: int = 0            # every message
    bytes_down: int = 0
    draft_bytes_up: int = 0      # Draft messages only
    drafted_tokens: int = 0      # tokens in Draft messages (re-sends included)
    q_encode_s: float = 0.0      # time spent coding q (Draft.q_coded)
    opens: int = 0
    verifier: str = ""           # the verifier process that took the last Open (Opened.verifier)
    moves: int = 0               # re-opens that another verifier took (several behind a balancer)


@dataclass
class Sent:
    """A block on its way: what the verdict must match, and when it left."""
    round: int
    start: int
    k: int
    bytes_up: int
    t_sent: float
    send_s: float


class VerifierLink:
    """Open / send a block without waiting / await its verdict, with byte counting.

    One link per generation; it may hold several streams in turn (re-opens). Not thread-safe.
    The generation gives it its wait rule and stop signal (bind) before the first open.
    """

    def __init__(self, stub: pb_grpc.DecodingStub, metadata: Sequence[tuple[str, str]], *,
                 session_id: str, target_model: str, fingerprint: str, sampling: SamplingParams,
                 fast: bool = False, pinned_digest: str = "",
                 offered_codec: QCodec | None = None) -> None:
        self.stub = stub
        # The session id rides on every call (Session streams and the probes of its waits): a
        # balancer that hashes it (ring_hash, docker/nginx-grpc.conf) keeps the session on one
        # verifier, and the probes ask that verifier.
        self.metadata = (*metadata, (SESSION_HEADER, session_id))
        self.session_id = session_id
        self.target_model = target_model
        self.fingerprint = fingerprint
        self.sampling = sampling
        self.should_stop: Callable[[], bool] = lambda: False  # the generation's: bind
        self.fast = fast             # open in MODE_FAST: blocks may carry unverified tokens
        # The coded q format this edge offers (Open.q_codecs), and the one the open stream
        # negotiated (Opened.q_codec; None: plain SparseDistribution messages).
        self.offered_codec = offered_codec
        self.q_codec: QCodec | None = None
        # Target identity (edge/link/errors.check_identity): every open and re-open must meet
        # the pinned digest (if any) and the one the generation's first open saw.
        self.pinned_digest = pinned_digest
        self.seen_digest: str | None = None
        self.open_rtt_s: float | None = None
        # How long a wait may go on (the generation's: bind).
        self.wait_rule = WaitRule()
        self.prefill_s = 0.0
        # Context length the verifier holds (set by Opened and each verdict): in fast mode the
        # edge's context runs ahead of it by the tokens it emitted unverified since.
        self.server_context = 0
        self.stream: SessionStream | None = None
        self.limits: pb.Limits | None = None
        self.load = 0.0
        # The verifier's price (protos/tandem/v1/decoding.proto), as its last reply said; 0
        # from a verifier that does not price its passes (Opened.priced unset).
        self.price = 0.0
        # What a drafted position costs that verifier (Opened.position_cost); None: not
        # measured there, or not said (the controller's own estimate then).
        self.position_cost: float | None = None
        # What a committed token costs that verifier per mode, ms (speculate, cloud), as its
        # last reply said (the session's own figure where it has one); None: not measured.
        self.token_ms: TokenMs = (None, None)
        self.wire_round = 0          # Draft.round of the last block sent
        self.totals = LinkTotals()

    def bind(self, wait_rule: WaitRule, should_stop: Callable[[], bool]) -> None:
        """Give the link its generation's wait rule (the request's offline policy:
        OfflineControl.wait_rule) and stop signal; every later open and wait goes by them.
        Called once, by the generation that uses the link (edge/generation.py), before any
        open: the link is built per generation, before the generation's state exists."""
        self.wait_rule = wait_rule
        self.should_stop = should_stop

    @property
    def is_open(self) -> bool:
        return self.stream is not None

    def open(self, context: Sequence[int], late_s: float, cap_s: float | None = None) -> None:
        """A new stream, Open with the full context, wait for Opened (late after late_s, at most
        cap_s: WaitRule). Raises LinkDown (also when evicted while opening: no room even to
        open), VerifierRefused, Stopped."""
        self.drop()
        stream = SessionStream(self.stub, self.metadata)
        message = open_message(self.session_id, self.target_model, self.fingerprint, context,
                               self.sampling, self.fast, self.offered_codec)
        t_open = time.monotonic()
        self.totals.bytes_up += stream.send(message)
        try:
            opened = read_opened(self._recv(stream, late_s, cap_s), self.pinned_digest,
                                 self.seen_digest)
        except BaseException:
            stream.abandon()
            raise
        if opened.HasField("target") and opened.target.digest:
            self.seen_digest = opened.target.digest
        self.limits = opened.limits if opened.HasField("limits") else None
        # An older verifier says nothing (plain q); one naming a format not offered is ignored.
        offered = self.offered_codec
        self.q_codec = offered if offered is not None and opened.q_codec == offered.name \
            else None
        self.load = opened.load
        self.price = read_price(opened.price) if opened.priced else 0.0
        self.position_cost = read_price(opened.position_cost) \
            if opened.priced and opened.HasField("position_cost") else None
        self.token_ms = read_token_ms(opened) if opened.priced else (None, None)
        # The Open's round trip and the server's share of it (the offline policy's first RTT).
        self.open_rtt_s = time.monotonic() - t_open
        self.prefill_s = opened.prefill_ms / 1000.0
        self.stream = stream
        self.server_context = len(context)
        self.totals.opens += 1
        self._served_by(opened.verifier)

    def _served_by(self, verifier: str) -> None:
        """Count a re-open that another verifier took (it prefilled the whole context again)."""
        before, self.totals.verifier = self.totals.verifier, verifier
        if before and verifier and verifier != before:
            self.totals.moves += 1
            log.info("session %s moved from verifier %s to %s", self.session_id, before, verifier)

    def send(self, start: int, block: "Block", unverified: Sequence[int] = (), *,
             ahead: bool = False, assumed_token: int = 0, in_flight: int = 1) -> Sent:
        """Queue Draft(round, start, block) on the open stream; returns at once. `unverified`
        (fast mode): tokens emitted since the verifier's context, sent ahead of the block; the
        block then starts at start + len(unverified). `ahead` (send-ahead, edge/rounds/pipelined.py):
        the block assumes the one before it is accepted whole with bonus `assumed_token`;
        `in_flight` counts the blocks in flight with this one."""
        assert self.stream is not None, "send on a closed link"
        assert not unverified or self.fast, "unverified tokens on a lossless session"
        t0 = time.monotonic()
        self.wire_round += 1
        draft = pb.Draft(round=self.wire_round, start=start, tokens=block.tokens,
                         unverified=unverified)
        if ahead or in_flight > 1:  # unset on plain rounds: an older verifier reads them the same
            draft.ahead, draft.assumed_token, draft.in_flight = ahead, assumed_token, in_flight
        start += len(unverified)
        t_code = time.perf_counter()
        attach_q(draft, block, self.q_codec)
        if draft.q_coded:
            self.totals.q_encode_s += time.perf_counter() - t_code
        size = self.stream.send(pb.ClientMessage(draft=draft))
        self.totals.bytes_up += size
        self.totals.draft_bytes_up += size
        self.totals.drafted_tokens += len(block)
        t1 = time.monotonic()
        return Sent(round=self.wire_round, start=start, k=len(block), bytes_up=size,
                    t_sent=t1, send_s=t1 - t0)

    def await_verdict(self, sent: Sent, late_s: float,
                      allow_discarded: bool = False) -> tuple[pb.Verdict, int]:
        """The verdict of `sent` (late after late_s: WaitRule) and its serialized size. Raises
        Evicted, LinkDown, Stopped, VerifierRefused, ProtocolError. A discarded verdict
        (send-ahead) only when allowed."""
        assert self.stream is not None, "await on a closed link"
        reply = self._recv(self.stream, late_s)
        verdict = read_verdict(reply, sent, self.limits, allow_discarded)
        self.price = read_price(verdict.price)
        self.token_ms = read_token_ms(verdict)
        if not verdict.discarded:
            self.server_context = sent.start + verdict.accepted + 1
        return verdict, reply.ByteSize()

    def send_generate(self, start: int, max_tokens: int, stop_ids: Sequence[int]) -> Sent:
        """Queue Generate (cloud-generates) on the open stream; returns at once."""
        assert self.stream is not None, "send on a closed link"
        t0 = time.monotonic()
        self.wire_round += 1
        size = self.stream.send(pb.ClientMessage(generate=pb.Generate(
            round=self.wire_round, start=start, max_tokens=max_tokens, stop_ids=stop_ids)))
        self.totals.bytes_up += size
        t1 = time.monotonic()
        return Sent(round=self.wire_round, start=start, k=0, bytes_up=size, t_sent=t1,
                    send_s=t1 - t0)

    def await_generated(self, sent: Sent, late_s: float) -> tuple[pb.Generated, int]:
        """The next token of a Generate (late after late_s: WaitRule) and its serialized size.
        Raises Evicted, LinkDown, Stopped, VerifierRefused, ProtocolError."""
        assert self.stream is not None, "await on a closed link"
        reply = self._recv(self.stream, late_s)
        generated = read_generated(reply, sent, self.limits)
        self.price = read_price(generated.price)
        self.token_ms = read_token_ms(generated)
        self.server_context = generated.context_length
        return generated, reply.ByteSize()

    def _recv(self, stream: SessionStream, late_s: float,
              cap_s: float | None = None) -> pb.ServerMessage:
        """The next message on `stream`, waited for under the WaitRule."""
        reply = self.wait_rule.recv(stream, late_s, cap_s, should_stop=self.should_stop,
                                    probe=self._probe)
        self.totals.bytes_down += reply.ByteSize()
        return reply

    def _probe(self, timeout_s: float) -> grpc.Future:
        """Ask the verifier for Info on the link's channel (is it there?)."""
        return self.stub.Info.future(pb.InfoRequest(), metadata=self.metadata, timeout=timeout_s)

    def drop(self) -> None:
        """Abandon the stream (broken, evicted, or stopped) without waiting for the server."""
        if self.stream is not None:
            self.stream.abandon()
            self.stream = None

    def close(self, reason: str = "done") -> None:
        if self.stream is not None:
            self.totals.bytes_up += self.stream.close(reason)
            self.stream = None


def read_verdict(reply: pb.ServerMessage, sent: Sent, limits: pb.Limits | None,
                 allow_discarded: bool) -> pb.Verdict:
    """The verdict of `sent` in `reply`, checked. Raises Evicted, ProtocolError. A discarded
    verdict (send-ahead) only when allowed."""
    kind = reply.WhichOneof("kind")
    if kind == "evicted":
        raise Evicted()
    if kind != "verdict":
        raise ProtocolError(f"expected Verdict for round {sent.round}, got {kind}")
    if reply.verdict.discarded:
        if not allow_discarded or reply.verdict.round != sent.round:
            raise ProtocolError(f"unexpected discarded verdict for round "
                                f"{reply.verdict.round} (awaiting {sent.round})")
        return reply.verdict
    check_verdict(reply.verdict, sent.round, sent.start, sent.k, limits)
    return reply.verdict


def read_generated(reply: pb.ServerMessage, sent: Sent,
                   limits: pb.Limits | None) -> pb.Generated:
    """The next token of the Generate `sent` in `reply`, checked. Raises Evicted,
    ProtocolError."""
    kind = reply.WhichOneof("kind")
    if kind == "evicted":
        raise Evicted()
    if kind != "generated" or reply.generated.round != sent.round:
        raise ProtocolError(f"expected Generated for round {sent.round}, got {kind}")
    vocab = verifier_vocab(limits)
    if vocab and reply.generated.token >= vocab:
        raise ProtocolError(f"generated token {reply.generated.token} outside the vocabulary")
    return reply.generated


def read_price(price: float) -> float:
    """A reply's price held to 0..1 (NaN: 0), whatever the verifier sent."""
    return min(max(price, 0.0), 1.0) if math.isfinite(price) else 0.0


def read_token_ms(reply: pb.Opened | pb.Verdict | pb.Generated) -> TokenMs:
    """(speculate, cloud) ms per committed token as a reply said them; None where absent or
    not a positive finite figure."""
    def one(name: str) -> float | None:
        value = getattr(reply, name) if reply.HasField(name) else None
        return value if value is not None and math.isfinite(value) and value > 0 else None

    return one("speculate_token_ms"), one("cloud_token_ms")


def check_verdict(verdict: pb.Verdict, round_: int, start: int, k: int,
                  limits: pb.Limits | None) -> None:
    """A verdict must answer this round, accept at most the block, and name a real token."""
    if verdict.round != round_:
        raise ProtocolError(f"verdict for round {verdict.round}, expected {round_}")
    if verdict.accepted > k:
        raise ProtocolError(f"accepted {verdict.accepted} of a {k}-token block")
    if verdict.context_length and verdict.context_length != start + verdict.accepted + 1:
        raise ProtocolError(f"verdict context length {verdict.context_length}, expected "
                            f"{start + verdict.accepted + 1}")
    vocab = verifier_vocab(limits)
    if vocab and verdict.token >= vocab:
        raise ProtocolError(f"bonus token {verdict.token} outside the vocabulary")


def open_message(session_id: str, model: str, fingerprint: str, context: Sequence[int],
                 params: SamplingParams, fast: bool,
                 offered_codec: QCodec | None) -> pb.ClientMessage:
    """Open with the full context; the coded q format is offered only where q is sent."""
    return pb.ClientMessage(open=pb.Open(
        session_id=session_id, model=model, tokenizer_fingerprint=fingerprint,
        context_ids=list(context),
        sampling=pb.SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                   top_p=params.top_p, seed=params.seed),
        mode=pb.MODE_FAST if fast else pb.MODE_LOSSLESS, priced=True,
        q_codecs=[offered_codec.name]  # greedy sends no q: nothing to offer
        if offered_codec is not None and not params.greedy else []))


def read_opened(reply: pb.ServerMessage, pinned_digest: str,
                seen_digest: str | None) -> pb.Opened:
    """The Opened in `reply`, its target identity checked (edge/link/errors.check_identity).
    Raises LinkDown (evicted while opening: no room even to open), ProtocolError,
    VerifierMisconfigured."""
    kind = reply.WhichOneof("kind")
    if kind == "evicted":
        raise LinkDown("evicted while opening")
    if kind != "opened":
        raise ProtocolError(f"expected Opened, got {kind}")
    opened = reply.opened
    try:
        check_identity(opened.target if opened.HasField("target") else None, pinned_digest,
                       seen_digest)
    except IdentityMismatch as mismatch:
        raise VerifierMisconfigured(str(mismatch)) from None
    return opened


def attach_q(draft: pb.Draft, block: "Block", codec: QCodec | None) -> None:
    """The block's q: coded in one byte string when the session negotiated a format and every
    q is on its grid (a block drafted before a re-open may not be), else plain."""
    if codec is not None and block.q:
        try:
            draft.q_coded = codec.encode(block.tokens, block.q)
            return
        except InvalidDistribution:
            pass  # drafted for another format (before a re-open): sent plain below
    for q in block.q:
        to_proto(q, draft.q.add())
